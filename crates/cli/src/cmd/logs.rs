use crate::cmd::exec::find_pod;
use crate::common::Ctx;
use anyhow::bail;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

pub fn run(ctx: &Ctx, ns: &str, pod: &str, container: Option<&str>, follow: bool) -> anyhow::Result<()> {
    if let Some(node) = pod.strip_prefix("node/") {
        return node_proxy(ctx, node, follow);
    }
    let st = ctx.status()?;
    let p = find_pod(&st, ns, pod)?;
    let containers: Vec<_> = match container {
        Some(c) => match p.containers.iter().find(|x| x.name == c) {
            Some(x) => vec![x],
            None => {
                let names: Vec<&str> = p.containers.iter().map(|x| x.name.as_str()).collect();
                bail!("pod {ns}/{} has no container {c:?} (it has {})", p.name, names.join(", "))
            }
        },
        None => p.containers.iter().collect(),
    };
    if follow && containers.len() > 1 {
        bail!("pod {ns}/{} has several containers; choose one with -c to follow", p.name);
    }
    let name = p.name.clone();
    for c in &containers {
        if containers.len() > 1 {
            crate::common::out(&format!("==> container {} <==\n", c.name))?;
        }
        // Not started yet: no output.
        if Path::new(&c.log).exists() {
            print_file(Path::new(&c.log), follow, || ctx.status().map(|s| s.pod(ns, &name).is_none()).unwrap_or(true))?;
        }
    }
    if follow {
        eprintln!("pod {ns}/{name} is gone");
    }
    Ok(())
}

/// `logs node/NODE`: the node proxy's diagnostics and access logs.
fn node_proxy(ctx: &Ctx, node: &str, follow: bool) -> anyhow::Result<()> {
    let path = ctx.paths.node_proxy_log(node);
    if !path.exists() {
        let st = ctx.status()?;
        let names: Vec<&str> = st.nodes.iter().map(|n| n.name.as_str()).collect();
        bail!("no node proxy log for node {node:?} (nodes: {})", names.join(", "));
    }
    print_file(&path, follow, || !path.exists())
}

/// Prints the file; with `follow`, keeps printing what is appended until
/// `gone` says the writer is gone.
fn print_file(path: &Path, follow: bool, gone: impl Fn() -> bool) -> anyhow::Result<()> {
    let mut f = std::fs::File::open(path)?;
    let mut out = std::io::stdout().lock();
    let mut pos = 0u64;
    loop {
        // Rotated (copied and emptied, crate::logrotate): start again.
        if f.metadata()?.len() < pos {
            pos = 0;
        }
        f.seek(SeekFrom::Start(pos))?;
        let mut chunk = Vec::new();
        f.read_to_end(&mut chunk)?;
        pos += chunk.len() as u64;
        match out.write_all(&chunk).and_then(|_| out.flush()) {
            // `logs ... | head`: the reader is done, so are we.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            r => r?,
        }
        if !follow || gone() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
