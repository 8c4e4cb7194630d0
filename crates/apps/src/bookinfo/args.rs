//! The command line of `slipstream app bookinfo`.

use std::net::IpAddr;

/// Which bookinfo service a process is.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The front end: calls details and reviews, renders /productpage.
    Productpage,
    /// Book details.
    Details,
    /// Book reviews: v1 without ratings, v2 and v3 call ratings.
    Reviews,
    /// Book ratings (stars).
    Ratings,
}

impl Role {
    /// The service name, as used in `served_by` and default hostnames.
    pub fn name(self) -> &'static str {
        match self {
            Role::Productpage => "productpage",
            Role::Details => "details",
            Role::Reviews => "reviews",
            Role::Ratings => "ratings",
        }
    }
}

/// Command-line flags of `slipstream app bookinfo`.
///
/// Upstream addresses come from the environment variables real bookinfo
/// reads (DETAILS_HOSTNAME, REVIEWS_HOSTNAME, RATINGS_HOSTNAME, default: the
/// service name; SERVICES_DOMAIN, appended as `.<domain>` when set; port
/// <NAME>_SERVICE_PORT, default 9080); the --*-addr flags override them.
#[derive(clap::Args, Debug, Clone)]
pub struct BookinfoArgs {
    /// Which bookinfo service to run.
    #[arg(long, value_enum)]
    pub role: Role,

    /// Version of the service, v<N>. reviews has v1 (no ratings), v2 (black stars) and v3 (red stars).
    #[arg(long, default_value = "v1", value_name = "vN")]
    pub version: String,

    /// Port to listen on.
    #[arg(long, default_value_t = super::DEFAULT_PORT, value_name = "PORT")]
    pub port: u16,

    /// Address to listen on. `::` is dual-stack and falls back to 0.0.0.0 when IPv6 is unavailable.
    #[arg(long, default_value = "::", value_name = "IP")]
    pub bind: IpAddr,

    /// Address of the details service [default: from DETAILS_HOSTNAME and SERVICES_DOMAIN, port 9080].
    #[arg(long, value_name = "HOST:PORT")]
    pub details_addr: Option<String>,

    /// Address of the reviews service [default: from REVIEWS_HOSTNAME and SERVICES_DOMAIN, port 9080].
    #[arg(long, value_name = "HOST:PORT")]
    pub reviews_addr: Option<String>,

    /// Address of the ratings service [default: from RATINGS_HOSTNAME and SERVICES_DOMAIN, port 9080].
    #[arg(long, value_name = "HOST:PORT")]
    pub ratings_addr: Option<String>,

    /// Do not log a line per request.
    #[arg(long)]
    pub quiet: bool,
}
