use crate::cmd::exec::find_pod;
use crate::common::Ctx;
use anyhow::bail;
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

pub fn run(ctx: &Ctx, ns: &str, pod: &str, container: Option<&str>, follow: bool) -> anyhow::Result<()> {
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
    let (name, pod_name) = (p.name.clone(), p.name.clone());
    let mut out = std::io::stdout().lock();
    for c in &containers {
        if containers.len() > 1 {
            writeln!(out, "==> container {} <==", c.name)?;
        }
        let mut f = match std::fs::File::open(&c.log) {
            Ok(f) => f,
            Err(_) => continue, // not started yet: no output
        };
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        out.write_all(&buf)?;
        out.flush()?;
        if follow {
            let mut pos = f.stream_position()?;
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let len = std::fs::metadata(&c.log).map(|m| m.len()).unwrap_or(0);
                if len > pos {
                    f.seek(SeekFrom::Start(pos))?;
                    let mut chunk = Vec::new();
                    f.read_to_end(&mut chunk)?;
                    pos += chunk.len() as u64;
                    out.write_all(&chunk)?;
                    out.flush()?;
                }
                if ctx.status().map(|s| s.pod(ns, &pod_name).is_none()).unwrap_or(true) {
                    eprintln!("pod {ns}/{name} is gone");
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}
