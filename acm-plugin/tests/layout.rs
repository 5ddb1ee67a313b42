//! Checks every `#[repr(C)]` mirror against the installed C headers: a C program prints
//! `sizeof`/`offsetof` for each row of `acmrs::ffi::layout_table()`, compiled with `cc`.

use std::process::Command;

#[test]
fn mirrors_match_installed_headers() {
    let rows = acmrs::ffi::layout_table();
    let dir = std::env::temp_dir().join(format!("acmrs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\
         #include <infiniband/umad.h>\n#include <infiniband/umad_sa.h>\n\
         #include <infiniband/acm.h>\n#include <infiniband/acm_prov.h>\n\
         int main(void) {\n",
    );
    for (expr, _) in &rows {
        c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("  printf(\"%zu\\n\", offsetof(struct ibv_port_attr, lid));\n");
    c.push_str("  printf(\"%zu\\n\", offsetof(struct ibv_port_attr, active_mtu));\n");
    c.push_str("  printf(\"%zu\\n\", offsetof(struct ibv_port_attr, active_width));\n");
    c.push_str("  printf(\"%zu\\n\", offsetof(struct ibv_port_attr, active_speed));\n");
    c.push_str("  return 0;\n}\n");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let out = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc must be installed (build-essential)");
    assert!(
        out.status.success(),
        "C layout program did not compile (need ibacm, libibverbs-dev, libibumad-dev): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let got: Vec<usize> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let mut expected: Vec<(&str, usize)> = rows.clone();
    use acmrs::ffi::*;
    expected.push(("offsetof(struct ibv_port_attr, lid)", PORT_ATTR_LID));
    expected.push((
        "offsetof(struct ibv_port_attr, active_mtu)",
        PORT_ATTR_ACTIVE_MTU,
    ));
    expected.push((
        "offsetof(struct ibv_port_attr, active_width)",
        PORT_ATTR_ACTIVE_WIDTH,
    ));
    expected.push((
        "offsetof(struct ibv_port_attr, active_speed)",
        PORT_ATTR_ACTIVE_SPEED,
    ));
    assert_eq!(got.len(), expected.len());
    let mut bad = Vec::new();
    for ((expr, ours), theirs) in expected.iter().zip(&got) {
        if ours != theirs {
            bad.push(format!("{expr}: rust {ours}, C {theirs}"));
        }
    }
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
    assert_eq!(
        got[expected
            .iter()
            .position(|r| r.0 == "sizeof(struct acm_provider)")
            .unwrap()],
        120
    );
}
