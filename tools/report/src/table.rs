//! [`Table`]: results as an aligned GitHub-Markdown table, readable as plain text too.

use std::fmt::Write as _;

use crate::Summary;

/// A result table printed with aligned columns.
#[derive(Clone, Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells print empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The standard latency cells: p50, p99, p99.9, p99.99, max (ns, 1 decimal).
    pub fn latency_cells(s: &Summary) -> Vec<String> {
        [s.p50_ns, s.p99_ns, s.p999_ns, s.p9999_ns, s.max_ns]
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect()
    }

    /// [`latency_cells`](Self::latency_cells) as multiples of `floor_ns` (2 decimals): the
    /// `hit ×floor` rows.
    pub fn floor_cells(s: &Summary, floor_ns: f64) -> Vec<String> {
        [s.p50_ns, s.p99_ns, s.p999_ns, s.p9999_ns, s.max_ns]
            .iter()
            .map(|v| format!("{:.2}", v / floor_ns))
            .collect()
    }

    /// Renders the table as GitHub-flavoured Markdown (readable as plain text too).
    pub fn render(&self) -> String {
        let cols = self
            .header
            .len()
            .max(self.rows.iter().map(Vec::len).max().unwrap_or(0));
        let cell = |r: &Vec<String>, i: usize| r.get(i).cloned().unwrap_or_default();
        let mut w = vec![3usize; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, wi) in w.iter_mut().enumerate() {
                *wi = (*wi).max(cell(r, i).chars().count());
            }
        }
        let line = |r: &Vec<String>| {
            let mut s = String::from("|");
            for (i, wi) in w.iter().enumerate() {
                let c = cell(r, i);
                if i == 0 {
                    let _ = write!(s, " {c:<wi$} |");
                } else {
                    let _ = write!(s, " {c:>wi$} |");
                }
            }
            s
        };
        let mut out = line(&self.header);
        out.push('\n');
        out.push('|');
        for (i, wi) in w.iter().enumerate() {
            out.push_str(&"-".repeat(wi + 1));
            out.push_str(if i == 0 { "-|" } else { ":|" });
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_renders_aligned() {
        let mut t = Table::new(&["a", "bb"]);
        t.row(vec!["x".into(), "1".into()]);
        let r = t.render();
        assert_eq!(r.lines().count(), 3);
        assert!(r
            .lines()
            .all(|l| l.len() == r.lines().next().unwrap().len()));
    }
}
