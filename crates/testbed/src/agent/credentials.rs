//! The cluster's credentials: the mesh root (the operator's or a new one),
//! the node proxies' tokens, the tokens of waypoint pods, and the files
//! pods must not see.

use super::files::write_private;
use crate::names::Paths;
use std::collections::BTreeMap;

/// Files every confined pod process gets covered (see
/// `SandboxSpec::masked_files`): the operator's `--ca-key`, as recorded by
/// the agent that copied it.
pub fn masked_files(paths: &Paths) -> Vec<std::path::PathBuf> {
    match std::fs::read_to_string(paths.operator_key_record()) {
        Ok(p) if !p.trim().is_empty() => vec![std::path::PathBuf::from(p.trim_end_matches('\n'))],
        _ => Vec::new(),
    }
}

/// One random token per node (the local cluster's node credentials): each
/// node proxy reads its own; the control plane reads them all. Root only.
/// 32 random bytes in hex.
pub fn random_token() -> String {
    use rand::RngCore;
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes one token per node (its own file) and all of them for the
/// control plane.
pub fn write_node_tokens(paths: &Paths, nodes: &[String]) -> anyhow::Result<()> {
    let mut all = BTreeMap::new();
    for n in nodes {
        let token = random_token();
        write_private(&paths.node_token_file(n), &token)?;
        all.insert(n.clone(), token);
    }
    write_private(&paths.node_tokens_file(), &serde_json::to_string_pretty(&all)?)?;
    Ok(())
}

/// The mesh root: the operator's (copied in) or a new one.
pub fn ensure_ca(paths: &Paths, cert: Option<&std::path::Path>, key: Option<&std::path::Path>) -> anyhow::Result<()> {
    let dir = paths.ca_dir();
    std::fs::create_dir_all(&dir)?;
    let (cert_out, key_out) = (dir.join("root-cert.pem"), dir.join("root-key.pem"));
    match (cert, key) {
        (Some(c), Some(k)) => {
            // Validate before use: a bad root is an error now, not at the first connection.
            validate_ca(c, k)?;
            std::fs::copy(c, &cert_out)?;
            std::fs::copy(k, &key_out)?;
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&key_out, std::fs::Permissions::from_mode(0o600))?;
            }
            // Pods keep read access to the machine's files: the original key
            // gets covered in every pod process (`masked_files`).
            let original = std::fs::canonicalize(k)?;
            write_private(&paths.operator_key_record(), &format!("{}\n", original.display()))?;
            tracing::info!("mesh root from {} (its key {} is hidden from pods)", c.display(), original.display());
        }
        (None, None) => {
            let td = slipstream_core::TrustDomain::new(slipstream_core::DEFAULT_TRUST_DOMAIN)?;
            let ca = slipstream_identity::Ca::generate(&td)?;
            std::fs::write(&cert_out, ca.cert_pem())?;
            write_private(&key_out, &ca.key_pem())?;
            tracing::info!("generated a mesh root in {}", dir.display());
        }
        _ => anyhow::bail!("--ca-cert and --ca-key go together"),
    }
    Ok(())
}

/// An operator's CA is usable: it loads, signs, is valid now and for at
/// least the lifetime of a workload certificate (one that ends sooner
/// would cut certificates short and stop the mesh within a day).
/// `up` runs this before creating anything, the agent again before use.
pub fn validate_ca(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let ca = slipstream_identity::Ca::from_pem_files(cert, key, None)
        .with_context(|| format!("loading the CA from {} and {}", cert.display(), key.display()))?;
    ca.check_lifetime(slipstream_identity::DEFAULT_WORKLOAD_VALIDITY)?;
    Ok(())
}
