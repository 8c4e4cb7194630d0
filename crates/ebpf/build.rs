//! Compiles the BPF programs of `bpf/` with clang and leaves the objects in
//! OUT_DIR, where `src/programs.rs` embeds them. One object per attach
//! point; every map they share is declared once in `bpf/include/ss_lib.h`
//! and pinned by name, so the objects meet in the same maps at load time.

use std::path::{Path, PathBuf};
use std::process::Command;

// test_policy and test_splice are embedded by the tests only.
const PROGRAMS: [&str; 11] = [
    "connect4",
    "connect6",
    "getpeername4",
    "sendmsg4",
    "sendmsg6",
    "sockops",
    "sock_release",
    "tc_ingress",
    "tc_egress",
    "test_policy",
    "test_splice",
];

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let dir = Path::new("bpf");
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // <linux/types.h> includes <asm/types.h>, which Debian keeps under the
    // multiarch directory: the BPF target has none of its own.
    let multiarch = Command::new("gcc")
        .arg("-print-multiarch")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{}-linux-gnu", std::env::consts::ARCH));
    // The objects' debug information (BTF line info) names their sources
    // relative to the repository, not where this clone happens to be: the
    // binary, and the images made from it, are the same bytes wherever
    // it is built.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    for p in PROGRAMS {
        let src = dir.join(format!("{p}.c"));
        let obj = out.join(format!("{p}.o"));
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c"])
            .arg(format!("-ffile-prefix-map={manifest}=crates/ebpf"))
            .arg("-fdebug-compilation-dir=crates/ebpf")
            .arg(format!("-I/usr/include/{multiarch}"))
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("clang failed on {} ({s}): see the errors above", src.display()),
            Err(e) => panic!(
                "cannot run `{clang}` to build the BPF programs ({e}): install clang, llvm and libbpf-dev \
                 (./scripts/setup.sh does), or point CLANG at a clang binary"
            ),
        }
    }
}
