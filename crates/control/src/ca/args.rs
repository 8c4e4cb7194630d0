//! The certificate service's flags of `slipstream control`, in one place
//! (flatten [`CaArgs`] into the command's arguments).

use super::roots::{CaFiles, CaSource};
use super::service::CaConfig;
use super::tokenreview::ReviewPolicy;
use slipstream_identity::TrustDomain;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct CaArgs {
    /// The CA's signing certificate (PEM: a root, or an intermediate under
    /// your root, optionally followed by its intermediates).
    #[arg(long, requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// The signing certificate's private key (PEM).
    #[arg(long, requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// Intermediates from the signing certificate's issuer up to your root
    /// (which may end the file).
    #[arg(long, requires = "ca_cert")]
    pub ca_chain: Option<PathBuf>,
    /// Every root to trust, concatenated (old and new during a rotation).
    #[arg(long, requires = "ca_cert")]
    pub root_bundle: Option<PathBuf>,
    /// Without --ca-cert: generate a root on first start and keep it here
    /// (root-cert.pem, root-key.pem readable by its owner only).
    #[arg(long, conflicts_with = "ca_cert")]
    pub ca_dir: Option<PathBuf>,
    /// The longest workload certificate issued (and the default).
    #[arg(long, default_value = "24h", value_parser = parse_lifetime)]
    pub max_cert_lifetime: Duration,
    /// Kubernetes: a node proxies' service account (namespace/name) allowed
    /// to request its pods' identities; repeatable.
    #[arg(long = "ca-node-proxy-account", default_value = "istio-system/ztunnel")]
    pub node_proxy_accounts: Vec<String>,
    /// Kubernetes: the audience node proxies' tokens must be for; repeatable.
    #[arg(long = "ca-token-audience", default_value = "istio-ca")]
    pub token_audiences: Vec<String>,
}

fn parse_lifetime(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (examples: 24h, 90m)"))?;
    if d < Duration::from_secs(60) {
        return Err(format!("{s:?}: a certificate must live at least a minute"));
    }
    Ok(d)
}

impl CaArgs {
    /// Where the CA material comes from.
    pub fn source(&self) -> anyhow::Result<CaSource> {
        match (&self.ca_cert, &self.ca_key, &self.ca_dir) {
            (Some(cert), Some(key), _) => Ok(CaSource::Files(CaFiles {
                cert: cert.clone(),
                key: key.clone(),
                chain: self.ca_chain.clone(),
                root_bundle: self.root_bundle.clone(),
            })),
            (None, None, Some(dir)) => Ok(CaSource::Generated { dir: dir.clone() }),
            _ => anyhow::bail!("the CA: give --ca-cert and --ca-key (your CA), or --ca-dir (a root generated and kept there)"),
        }
    }

    pub fn config(&self, trust_domain: TrustDomain) -> CaConfig {
        CaConfig { trust_domain, default_validity: self.max_cert_lifetime, max_validity: self.max_cert_lifetime, ..CaConfig::default() }
    }

    pub fn review_policy(&self) -> anyhow::Result<ReviewPolicy> {
        let node_proxies =
            ReviewPolicy::parse_accounts(&self.node_proxy_accounts).map_err(|e| anyhow::anyhow!("--ca-node-proxy-account: {e}"))?;
        Ok(ReviewPolicy { node_proxies, audiences: self.token_audiences.clone(), ..ReviewPolicy::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        ca: CaArgs,
    }

    fn parse(args: &[&str]) -> Result<CaArgs, String> {
        Cmd::try_parse_from(std::iter::once("control").chain(args.iter().copied())).map(|c| c.ca).map_err(|e| e.to_string())
    }

    #[test]
    fn flags() {
        let a = parse(&["--ca-cert", "c.pem", "--ca-key", "k.pem", "--root-bundle", "roots.pem"]).unwrap();
        assert_eq!(
            a.source().unwrap(),
            CaSource::Files(CaFiles { cert: "c.pem".into(), key: "k.pem".into(), chain: None, root_bundle: Some("roots.pem".into()) })
        );
        assert_eq!(a.config(TrustDomain::default()).max_validity, Duration::from_secs(24 * 3600));
        assert_eq!(a.review_policy().unwrap(), ReviewPolicy::default());

        let g = parse(&["--ca-dir", "/var/lib/slipstream/ca", "--max-cert-lifetime", "12h"]).unwrap();
        assert_eq!(g.source().unwrap(), CaSource::Generated { dir: "/var/lib/slipstream/ca".into() });
        assert_eq!(g.config(TrustDomain::default()).default_validity, Duration::from_secs(12 * 3600));

        assert!(parse(&["--ca-cert", "c.pem"]).is_err(), "a certificate needs its key");
        assert!(parse(&["--ca-cert", "c.pem", "--ca-key", "k.pem", "--ca-dir", "d"]).is_err());
        assert!(parse(&["--max-cert-lifetime", "10s"]).unwrap_err().contains("at least a minute"));
        assert!(parse(&[]).unwrap().source().unwrap_err().to_string().contains("--ca-cert and --ca-key"));
        let bad = parse(&["--ca-dir", "d", "--ca-node-proxy-account", "ztunnel"]).unwrap().review_policy().unwrap_err();
        assert!(bad.to_string().contains("not a service account as namespace/name"), "{bad}");
    }
}
