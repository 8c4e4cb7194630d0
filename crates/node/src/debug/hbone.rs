//! `slipstream debug hbone`: one HBONE CONNECT as any identity, signed by
//! the mesh's CA or by a throw-away one, to any address: "can identity X
//! reach Y through HBONE, and what does Y's node proxy answer?".

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue};
use slipstream_core::SpiffeId;
use slipstream_hbone::{CertSource, ConnectRequest, HboneError, Pool, PoolConfig, PoolKey, ResponseFlag};
use slipstream_identity::{Ca, FetchError, TrustBundle, WorkloadCert};
use tokio::time::Instant;

use super::exchange::{self, Payload, Plan};
use super::{parse_flag, parse_mark, parse_size, Output, BYPASS_MARK};

/// Flags of `slipstream debug hbone`.
#[derive(clap::Args, Debug, Clone)]
pub struct HboneArgs {
    /// The HBONE address: the destination pod's IP and port 15008.
    #[arg(long, value_name = "IP:PORT")]
    pub to: SocketAddr,
    /// The CONNECT `:authority`: the destination pod's IP and target port.
    #[arg(long, value_name = "IP:PORT")]
    pub authority: SocketAddr,
    /// The SPIFFE identity to present (a client certificate for it is
    /// minted on the spot).
    #[arg(long, value_name = "SPIFFE_ID")]
    pub identity: String,
    /// An identity the server's certificate may carry (repeatable); the
    /// handshake fails (IDENTITY_ERROR) if it carries none of them.
    #[arg(long = "expect", value_name = "SPIFFE_ID", required = true)]
    pub expect: Vec<String>,
    /// The mesh CA's certificate: trusted for the server's certificate and,
    /// with --ca-key, signs ours. [default: the cluster's CA]
    #[arg(long, value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,
    /// The mesh CA's key. [default: the cluster's CA]
    #[arg(long, value_name = "PEM")]
    pub ca_key: Option<PathBuf>,
    /// Sign our certificate with a new throw-away CA instead of the mesh's
    /// (what a workload of another mesh would present).
    #[arg(long, conflicts_with = "ca_key")]
    pub self_signed_ca: bool,
    /// Roots to check the server's certificate against. [default: --ca-cert]
    #[arg(long, value_name = "PEM")]
    pub roots: Option<PathBuf>,
    /// An extra request header `name=value` (repeatable).
    #[arg(long = "header", value_name = "NAME=VALUE")]
    pub headers: Vec<String>,
    /// Text to send once the tunnel is up.
    #[arg(long, value_name = "TEXT", conflicts_with = "send_bytes")]
    pub send: Option<String>,
    /// Send this many bytes of the pattern `abc...z` (e.g. 64KiB, 16MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub send_bytes: Option<u64>,
    /// Half-close after sending (END_STREAM), then read to the end.
    #[arg(long)]
    pub half_close: bool,
    /// Stop reading after this long without a byte.
    #[arg(long, default_value = "1s", value_parser = parse_flag)]
    pub idle: Duration,
    /// Give up after this long, handshakes included.
    #[arg(long, default_value = "15s", value_parser = parse_flag)]
    pub timeout: Duration,
    /// Socket mark; the default is the node proxy's own, which a meshed
    /// pod's capture lets through. 0 for none.
    #[arg(long, default_value_t = BYPASS_MARK, value_parser = parse_mark)]
    pub mark: u32,
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
}

/// The one certificate this tool presents, whatever identity is asked for.
struct FixedCert(Arc<WorkloadCert>);

impl CertSource for FixedCert {
    fn fetch<'a>(&'a self, _id: &'a SpiffeId) -> BoxFuture<'a, Result<Arc<WorkloadCert>, FetchError>> {
        let cert = self.0.clone();
        Box::pin(async move { Ok(cert) })
    }
}

/// How long the minted client certificate is valid.
const CERT_VALIDITY: Duration = Duration::from_secs(3600);

fn client_cert(args: &HboneArgs, id: &SpiffeId) -> anyhow::Result<WorkloadCert> {
    let ca_cert = args.ca_cert.as_ref().context("--ca-cert is required (the mesh CA, to check the server)")?;
    if !ca_cert.exists() {
        bail!(
            "no CA certificate at {}: is the cluster running? (name it with --cluster, or pass --ca-cert and --ca-key)",
            ca_cert.display()
        );
    }
    // Their errors name the file.
    let roots = TrustBundle::from_pem_file(args.roots.as_ref().unwrap_or(ca_cert))?;
    let issued = if args.self_signed_ca {
        Ca::generate(id.trust_domain()).context("generating a throw-away CA")?.issue(id, CERT_VALIDITY)?
    } else {
        let key = args.ca_key.as_ref().context("--ca-key is required unless --self-signed-ca")?;
        Ca::from_pem_files(ca_cert, key, None)?.issue(id, CERT_VALIDITY)?
    };
    // Our chain as issued, but the server checked against `roots`: with a
    // throw-away CA the two differ, which is the point.
    Ok(WorkloadCert::new(issued.chain().to_vec(), roots, issued.key().clone())?)
}

fn request(args: &HboneArgs) -> anyhow::Result<ConnectRequest> {
    let mut req = ConnectRequest::new(args.authority).with_fresh_traceparent();
    for h in &args.headers {
        let (name, value) = h.split_once('=').with_context(|| format!("--header {h:?}: expected NAME=VALUE"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes()).with_context(|| format!("--header: {name:?} is not a header name"))?;
        let value = HeaderValue::from_str(value).with_context(|| format!("--header {name}: the value is not a valid header value"))?;
        req = req.with_header(name, value);
    }
    Ok(req)
}

/// Runs the CONNECT and the exchange; prints the result. Fails with the
/// error and its response flag when the tunnel could not be opened or broke.
pub async fn run(args: HboneArgs) -> anyhow::Result<()> {
    let id: SpiffeId = args.identity.parse().with_context(|| format!("--identity {:?}", args.identity))?;
    let expect =
        args.expect.iter().map(|e| e.parse::<SpiffeId>().with_context(|| format!("--expect {e:?}"))).collect::<anyhow::Result<Vec<_>>>()?;
    let cert = client_cert(&args, &id)?;
    let req = request(&args)?;
    let deadline = Instant::now() + args.timeout;

    let mark = args.mark;
    let connect_timeout = args.timeout;
    let connector = move |dst: SocketAddr, _src: IpAddr| super::connect(dst, mark, connect_timeout);
    let config = PoolConfig { connect_timeout: args.timeout, response_timeout: args.timeout, ..PoolConfig::default() };
    let pool = Pool::new(config, Arc::new(FixedCert(Arc::new(cert))), Arc::new(connector));
    let key = PoolKey::new(id.clone(), expect, args.to, IpAddr::V4(Ipv4Addr::UNSPECIFIED));

    let tunnel = match tokio::time::timeout_at(deadline, pool.connect(&key, req)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return report_failure(&args, &e),
        Err(_) => return report_failure(&args, &HboneError::Timeout(slipstream_hbone::TimeoutStage::Connect)),
    };
    let send = match (&args.send, args.send_bytes) {
        (Some(t), _) => Payload::Bytes(t.clone().into_bytes()),
        (None, Some(n)) => Payload::Pattern(n),
        (None, None) => Payload::Bytes(Vec::new()),
    };
    let plan = Plan { send, half_close: args.half_close, recv_first: false, no_read: false, idle: args.idle, deadline };
    let out = exchange::run(tunnel, &plan).await;

    match args.output {
        Output::Json => {
            let v = serde_json::json!({
                "status": 200,
                "flag": ResponseFlag::None.as_str(),
                "identity": id.to_string(),
                "to": args.to.to_string(),
                "authority": args.authority.to_string(),
                "sent": out.sent,
                "received": out.received,
                "end": out.end,
                "half_closed": out.half_closed,
                "error": out.error,
                "data": String::from_utf8_lossy(&out.data),
            });
            println!("{v}");
        }
        Output::Text => {
            println!("CONNECT {} via {} as {}: 200", args.authority, args.to, id);
            println!(
                "sent {} bytes{}, received {} bytes ({:?})",
                out.sent,
                if out.half_closed { " and half-closed" } else { "" },
                out.received,
                out.end
            );
            let mut stdout = std::io::stdout();
            let _ = stdout.write_all(&out.data);
            if !out.data.is_empty() && !out.data.ends_with(b"\n") {
                let _ = stdout.write_all(b"\n");
            }
        }
    }
    if out.failed() {
        bail!("the tunnel broke: {} (flag {})", out.error.unwrap_or_default(), ResponseFlag::ConnectionTerminated);
    }
    Ok(())
}

fn report_failure(args: &HboneArgs, e: &HboneError) -> anyhow::Result<()> {
    let status = match e {
        HboneError::Status(code) => Some(code.as_u16()),
        _ => None,
    };
    if args.output == Output::Json {
        let v = serde_json::json!({
            "status": status,
            "flag": e.flag().as_str(),
            "to": args.to.to_string(),
            "authority": args.authority.to_string(),
            "error": e.to_string(),
        });
        println!("{v}");
    }
    bail!("CONNECT {} via {} failed: {e} (flag {})", args.authority, args.to, e.flag())
}
