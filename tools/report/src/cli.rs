//! The command-line conventions of every acmrs bench and tool (`bench`'s binaries,
//! `acm-fabric`, `acmrs-stat`, `acmrs-storm`, `madtool`).
//!
//! Each declares its command line as a [clap] derive (`#[derive(Parser)]`: the options are
//! the fields of a struct, their help its doc comments) and parses it with [`parse`], which
//! applies the conventions here to the command and each of its subcommands:
//!
//! * `--help` (or `-h`, or a `help` subcommand) prints the help on stdout and exits 0;
//!   `--version` prints `<name> <version>` and exits 0.
//! * A bad command line prints `error: …`, the usage line of the (sub)command and `For more
//!   information, try '--help'.` on stderr and exits with the tool's documented code for it
//!   (2 for the benches, `acm-fabric` and `acmrs-storm`; 1 for `acmrs-stat` and `madtool`).
//! * An option given twice takes its last value (`args_override_self`); repeatable options
//!   (`--opt`, `--provider`, …) are lists.
//! * `usage:` is spelled in lower case, in the help and in errors alike. Errors name an unknown command `unknown command 'x'`, an unknown flag
//!   `unexpected option '--x'` and missing arguments `this command needs <a> <b>`.
//! * Numbers may carry `_` separators ([`num`]), lists are comma-separated ([`List`],
//!   [`counts`], [`count`]), `NAME=VALUE` pairs are split at the first `=` ([`name_value`]).
//!
//! Why clap: it is maintained and the de-facto standard Rust parser, its derive keeps each
//! option's name, type, default and help in one place, every tool gets the same `--help`,
//! `--version` and error texts (with suggestions for typos) without code of its own, and shell
//! completions can be generated from the same definitions (`clap_complete`) when wanted.

use std::ffi::OsString;
use std::fmt::Display;
use std::path::PathBuf;
use std::str::FromStr;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgMatches, Command, CommandFactory, Parser};

/// The help layout of every command: clap's default with `usage:` in lower case.
pub const HELP_TEMPLATE: &str =
    "{before-help}{about-with-newline}\nusage: {usage}\n\n{all-args}{after-help}";

/// `cmd` and each of its subcommands with the conventions of this module.
fn conventions(cmd: Command) -> Command {
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    let mut cmd = cmd.args_override_self(true).help_template(HELP_TEMPLATE);
    for s in subs {
        cmd = cmd.mut_subcommand(s, conventions);
    }
    cmd
}

/// The command of `T` with the conventions of this module.
pub fn command<T: CommandFactory>() -> Command {
    conventions(T::command())
}

/// Parses `args` (the program name first) as `T`. `Err` is clap's error: help or version to
/// print ([`clap::Error::use_stderr`] false) or a bad command line ([`message`] words it).
pub fn try_parse_from<T, I, A>(args: I) -> Result<T, clap::Error>
where
    T: Parser,
    I: IntoIterator<Item = A>,
    A: Into<OsString> + Clone,
{
    let mut m: ArgMatches = command::<T>().try_get_matches_from(args)?;
    T::from_arg_matches_mut(&mut m).map_err(|e| e.format(&mut command::<T>()))
}

/// This process's command line as `T`; help and version are printed (exit 0), a bad command
/// line is reported (exit `code`), see the module's conventions.
pub fn parse<T: Parser>(code: u8) -> T {
    try_parse_from(std::env::args_os()).unwrap_or_else(|e| exit(&e, code))
}

/// Prints what `e` says and exits: help and version on stdout with 0, a bad command line
/// ([`message`]) on stderr with `code`.
pub fn exit(e: &clap::Error, code: u8) -> ! {
    if !e.use_stderr() {
        let _ = e.print();
        std::process::exit(0);
    }
    eprint!("{}", message(e));
    std::process::exit(i32::from(code))
}

/// The text of a bad command line: clap's error with the wording of the module's conventions.
pub fn message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let string = |k| match e.get(k) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    let what = match e.kind() {
        ErrorKind::InvalidSubcommand => {
            string(ContextKind::InvalidSubcommand).map(|c| format!("unknown command '{c}'"))
        }
        ErrorKind::UnknownArgument => string(ContextKind::InvalidArg).map(|a| {
            if a.starts_with('-') {
                format!("unexpected option '{a}'")
            } else {
                format!("unexpected argument '{a}'")
            }
        }),
        ErrorKind::MissingRequiredArgument => match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::Strings(args)) => {
                Some(format!("this command needs {}", args.join(" ")))
            }
            _ => None,
        },
        _ => None,
    };
    // clap's text: the error (with the lines that list its arguments), then blank-line separated
    // blocks (tips, the usage, the pointer to --help).
    let mut out = match (what, text.split_once("\n\n")) {
        (Some(w), Some((_, rest))) => format!("error: {w}\n\n{rest}"),
        (Some(w), None) => format!("error: {w}\n"),
        (None, _) => text,
    };
    if let Some(i) = out.find("Usage: ") {
        out.replace_range(i..i + 1, "u");
    }
    out
}

/// `--quick` and `--out DIR`: the options of every bench and of `acmrs-storm`.
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
pub struct RunOpts {
    /// A short smoke run (the CI's): fewer sizes, samples and repetitions
    #[arg(long)]
    pub quick: bool,
    /// Write the results (.hgrm, .svg, .md) into DIR (created if missing)
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

impl RunOpts {
    /// Creates the `--out` directory, if one was given.
    pub fn create_out(&self) -> Result<(), String> {
        match &self.out {
            Some(dir) => std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display())),
            None => Ok(()),
        }
    }

    /// [`create_out`](Self::create_out), or its error printed and exit 1.
    pub fn create_out_or_exit(&self) {
        if let Err(e) = self.create_out() {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }

    /// `DIR/name` for `--out DIR`.
    pub fn out_file(&self, name: &str) -> Option<PathBuf> {
        self.out.as_ref().map(|d| d.join(name))
    }
}

/// A number, `_` allowed as a digit separator (`30_000`): a clap `value_parser`.
pub fn num<T: FromStr>(s: &str) -> Result<T, String>
where
    T::Err: Display,
{
    s.trim()
        .replace('_', "")
        .parse()
        .map_err(|e| format!("{s:?}: {e}"))
}

/// A comma-separated list of [`num`]s (`1,10,100`, spaces around an item ignored).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct List<T>(pub Vec<T>);

impl<T: FromStr> FromStr for List<T>
where
    T::Err: Display,
{
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',').map(num).collect::<Result<_, _>>().map(List)
    }
}

/// A count: a [`num`] above 0 (`--lookups`): a clap `value_parser`.
pub fn count(s: &str) -> Result<usize, String> {
    match num(s)? {
        0 => Err(format!("{s:?} must be above 0")),
        n => Ok(n),
    }
}

/// A [`List`] of [`count`]s (`--sizes`, `--nodes`): a clap `value_parser`.
pub fn counts(s: &str) -> Result<List<usize>, String> {
    s.split(',').map(count).collect::<Result<_, _>>().map(List)
}

/// `NAME=VALUE`, split at the first `=`, both sides trimmed (`--opt`): a clap `value_parser`.
pub fn name_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: NAME=VALUE expected"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command line in the shape of the tools': flattened run options, a list, a repeated
    /// pair, subcommands with a required positional.
    #[derive(Parser, Debug)]
    #[command(name = "t", version)]
    struct T {
        #[command(flatten)]
        run: RunOpts,
        #[arg(long, value_parser = counts)]
        sizes: Option<List<usize>>,
        #[arg(long, value_parser = num::<u64>)]
        rate: Option<u64>,
        #[arg(long = "opt", value_parser = name_value)]
        opts: Vec<(String, String)>,
        #[command(subcommand)]
        cmd: Option<Sub>,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Sub {
        /// Answer a request
        Respond {
            #[arg(value_name = "request.bin")]
            req: PathBuf,
        },
    }

    fn parse(args: &[&str]) -> Result<T, String> {
        try_parse_from::<T, _, _>(std::iter::once("t").chain(args.iter().copied()))
            .map_err(|e| message(&e))
    }

    #[test]
    fn values_lists_and_pairs() {
        let a = parse(&[
            "--quick",
            "--out",
            "/tmp/x",
            "--sizes=1_000, 96256",
            "--rate",
            "30_000",
            "--opt",
            "a=1",
            "--opt= b = x=y ",
        ])
        .unwrap();
        assert!(a.run.quick);
        assert_eq!(a.run.out_file("f"), Some(PathBuf::from("/tmp/x/f")));
        assert_eq!(a.sizes, Some(List(vec![1_000, 96_256])));
        assert_eq!(a.rate, Some(30_000));
        assert_eq!(
            a.opts,
            [("a".into(), "1".into()), ("b".into(), "x=y".into())]
        );
        // The last of a repeated option wins.
        assert_eq!(
            parse(&["--rate", "1", "--rate", "2"]).unwrap().rate,
            Some(2)
        );
        assert!(parse(&["--sizes", "10,0"])
            .unwrap_err()
            .contains("\"0\" must be above 0"));
        assert!(parse(&["--sizes", "ten"]).is_err());
        assert!(parse(&["--opt", "a"]).unwrap_err().contains("NAME=VALUE"));
    }

    #[test]
    fn errors_say_what_is_wrong_then_the_usage() {
        let e = parse(&["--bogus"]).unwrap_err();
        assert!(e.starts_with("error: unexpected option '--bogus'\n"), "{e}");
        assert!(e.contains("\nusage: t [OPTIONS]"), "{e}");
        assert!(e.contains("try '--help'"), "{e}");
        let e = parse(&["frobnicate"]).unwrap_err();
        assert!(
            e.starts_with("error: unknown command 'frobnicate'\n"),
            "{e}"
        );
        let e = parse(&["respond"]).unwrap_err();
        assert!(
            e.starts_with("error: this command needs <request.bin>\n\nusage: t respond"),
            "{e}"
        );
        let e = parse(&["--out"]).unwrap_err();
        assert!(e.contains("'--out <DIR>'"), "{e}");
        // Help and version are not errors.
        for h in ["--help", "-h", "help", "--version"] {
            let e = try_parse_from::<T, _, _>(["t", h]).unwrap_err();
            assert!(!e.use_stderr(), "{h}");
        }
        let help = command::<T>().render_help().to_string();
        assert!(help.contains("usage: t [OPTIONS]"), "{help}");
        assert!(help.contains("A short smoke run"), "{help}");
    }
}
