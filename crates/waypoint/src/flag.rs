//! Envoy's response flags, as the waypoint reports them: one variant per
//! reason a request or connection did not simply go through, rendered to
//! Envoy's short code only where it is written (the access log's `flags`,
//! the metrics' `response_flags`), as the node proxy's `ProxyError` knows
//! its `ResponseFlag`.

use std::fmt;

/// Why a request (or a connection passed through) was answered or ended
/// as it was, in Envoy's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flag {
    /// `-`: nothing to report (answered by the endpoint, or refused for a
    /// reason Envoy has no flag for, such as a JWT or a stalled body).
    None,
    /// `NR`: no route rule matches, or the rule has no valid backend.
    NoRoute,
    /// `UH`: the backend has no ready endpoint.
    NoHealthyUpstream,
    /// `UF`: the endpoint could not be connected to.
    UpstreamConnectFailure,
    /// `UC`: the endpoint's connection ended before its answer.
    UpstreamConnectionTermination,
    /// `UT`: the attempt or the whole request timed out.
    UpstreamRequestTimeout,
    /// `UO`: the pool's `connectionPool` bound of requests in flight.
    UpstreamOverflow,
    /// `FI`: a fault rule aborted it.
    FaultInjected,
    /// `RL`: a LocalRateLimitPolicy limited it.
    RateLimited,
    /// `RBAC`: an authorization or network policy denied it.
    Rbac,
    /// `DPE`: the path is refused by the mesh's path normalization.
    DownstreamProtocolError,
}

impl Flag {
    /// Envoy's short code.
    pub fn as_str(self) -> &'static str {
        match self {
            Flag::None => "-",
            Flag::NoRoute => "NR",
            Flag::NoHealthyUpstream => "UH",
            Flag::UpstreamConnectFailure => "UF",
            Flag::UpstreamConnectionTermination => "UC",
            Flag::UpstreamRequestTimeout => "UT",
            Flag::UpstreamOverflow => "UO",
            Flag::FaultInjected => "FI",
            Flag::RateLimited => "RL",
            Flag::Rbac => "RBAC",
            Flag::DownstreamProtocolError => "DPE",
        }
    }
}

impl fmt::Display for Flag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Flag::*;

    #[test]
    fn each_flag_is_envoys_short_code() {
        let table = [
            (None, "-"),
            (NoRoute, "NR"),
            (NoHealthyUpstream, "UH"),
            (UpstreamConnectFailure, "UF"),
            (UpstreamConnectionTermination, "UC"),
            (UpstreamRequestTimeout, "UT"),
            (UpstreamOverflow, "UO"),
            (FaultInjected, "FI"),
            (RateLimited, "RL"),
            (Rbac, "RBAC"),
            (DownstreamProtocolError, "DPE"),
        ];
        for (flag, code) in table {
            assert_eq!(flag.as_str(), code);
            assert_eq!(flag.to_string(), code);
        }
    }
}
