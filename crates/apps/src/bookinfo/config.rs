//! Validated configuration of one bookinfo service, built in one place from
//! the flags and the environment (passed in, so tests need no real env).

use std::fmt;
use std::str::FromStr;

use http::uri::Authority;

use super::args::{BookinfoArgs, Role};
use crate::http::AccessLog;

/// Port every bookinfo service listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 9080;

/// A configuration that cannot be served; the text says what to change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("version {0:?} is not of the form v<N> (e.g. v1)")]
    BadVersion(String),
    #[error("reviews has versions v1 (no ratings), v2 (black stars) and v3 (red stars), not {0}")]
    UnknownReviewsVersion(String),
    #[error("{what} {value:?} is not a HOST:PORT address: {reason}")]
    BadAddress { what: String, value: String, reason: String },
}

/// A service version, `v<N>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version(pub u32);

impl FromStr for Version {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        s.strip_prefix('v')
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse().ok())
            .map(Version)
            .ok_or_else(|| ConfigError::BadVersion(s.to_owned()))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// What a reviews version does with ratings: the one behaviour that differs
/// between versions in the bookinfo call graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stars {
    /// v1: never calls ratings.
    None,
    /// v2 and v3: call ratings and show stars of this colour.
    Colored(&'static str),
}

/// Where the upstream services are, as `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstreams {
    pub details: Authority,
    pub reviews: Authority,
    pub ratings: Authority,
}

impl Upstreams {
    /// The addresses real bookinfo uses: `<NAME>_HOSTNAME` (default: the
    /// service name) with `.<SERVICES_DOMAIN>` appended when set, and port
    /// `<NAME>_SERVICE_PORT` (default 9080).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = |key: &str| env(key).filter(|v| !v.trim().is_empty());
        let domain = env("SERVICES_DOMAIN").map(|d| format!(".{d}")).unwrap_or_default();
        let addr = |service: &str| {
            let upper = service.to_ascii_uppercase();
            let host = env(&format!("{upper}_HOSTNAME")).unwrap_or_else(|| service.to_owned());
            let port = env(&format!("{upper}_SERVICE_PORT")).unwrap_or_else(|| DEFAULT_PORT.to_string());
            parse_authority(&format!("{host}{domain}:{port}"), &format!("{service} address from the environment"))
        };
        Ok(Upstreams { details: addr("details")?, reviews: addr("reviews")?, ratings: addr("ratings")? })
    }
}

/// Parses `host:port`; a missing port means the bookinfo default.
pub(crate) fn parse_authority(value: &str, what: &str) -> Result<Authority, ConfigError> {
    let bad = |reason: &str| ConfigError::BadAddress { what: what.to_owned(), value: value.to_owned(), reason: reason.to_owned() };
    let authority: Authority = value.parse().map_err(|_| bad("not a valid host and port"))?;
    if authority.host().is_empty() || authority.as_str().contains('@') {
        return Err(bad("expected HOST:PORT"));
    }
    match authority.port_u16() {
        Some(0) => Err(bad("port 0")),
        Some(_) => Ok(authority),
        None if authority.as_str().ends_with(':') => Err(bad("empty port")),
        None => format!("{authority}:{DEFAULT_PORT}").parse().map_err(|_| bad("not a valid host and port")),
    }
}

/// Everything one bookinfo service needs besides its listener.
#[derive(Debug, Clone)]
pub struct BookinfoConfig {
    role: Role,
    version: Version,
    upstreams: Upstreams,
    access_log: AccessLog,
}

impl BookinfoConfig {
    /// Checks that `role` has a version `version` (any `v<N>`, except
    /// reviews, which has v1, v2 and v3). No access log until
    /// [`BookinfoConfig::with_access_log`].
    pub fn new(role: Role, version: &str, upstreams: Upstreams) -> Result<Self, ConfigError> {
        let version: Version = version.parse()?;
        if role == Role::Reviews && !(1..=3).contains(&version.0) {
            return Err(ConfigError::UnknownReviewsVersion(version.to_string()));
        }
        Ok(BookinfoConfig { role, version, upstreams, access_log: AccessLog::Off })
    }

    pub fn with_access_log(mut self, access_log: AccessLog) -> Self {
        self.access_log = access_log;
        self
    }

    /// The configuration `slipstream app bookinfo` runs with: flags win over
    /// the environment.
    pub fn from_args(args: &BookinfoArgs, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut upstreams = Upstreams::from_env(env)?;
        let overrides = [
            (&args.details_addr, &mut upstreams.details, "--details-addr"),
            (&args.reviews_addr, &mut upstreams.reviews, "--reviews-addr"),
            (&args.ratings_addr, &mut upstreams.ratings, "--ratings-addr"),
        ];
        for (flag_value, slot, flag) in overrides {
            if let Some(value) = flag_value {
                *slot = parse_authority(value, flag)?;
            }
        }
        Ok(BookinfoConfig::new(args.role, &args.version, upstreams)?.with_access_log(AccessLog::stdout_unless(args.quiet)))
    }

    /// `<role>-<version>`, e.g. `reviews-v2`: what every answer reports.
    pub fn served_by(&self) -> String {
        format!("{}-{}", self.role.name(), self.version)
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn upstreams(&self) -> &Upstreams {
        &self.upstreams
    }

    pub(crate) fn access_log(&self) -> &AccessLog {
        &self.access_log
    }

    pub(crate) fn stars(&self) -> Stars {
        match (self.role, self.version.0) {
            (Role::Reviews, 2) => Stars::Colored("black"),
            (Role::Reviews, 3) => Stars::Colored("red"),
            _ => Stars::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |key| vars.get(key).cloned()
    }

    fn upstreams() -> Upstreams {
        Upstreams::from_env(env(&[])).unwrap()
    }

    #[test]
    fn env_defaults_are_the_service_names_on_9080() {
        let u = upstreams();
        assert_eq!((u.details.as_str(), u.reviews.as_str(), u.ratings.as_str()), ("details:9080", "reviews:9080", "ratings:9080"));
    }

    #[test]
    fn env_hostnames_domain_and_ports_are_honoured() {
        let u = Upstreams::from_env(env(&[
            ("SERVICES_DOMAIN", "default.svc.cluster.local"),
            ("RATINGS_HOSTNAME", "ratings-canary"),
            ("DETAILS_SERVICE_PORT", "9999"),
            ("REVIEWS_HOSTNAME", ""),
        ]))
        .unwrap();
        assert_eq!(u.ratings.as_str(), "ratings-canary.default.svc.cluster.local:9080");
        assert_eq!(u.details.as_str(), "details.default.svc.cluster.local:9999");
        assert_eq!(u.reviews.as_str(), "reviews.default.svc.cluster.local:9080", "empty means unset");
    }

    #[test]
    fn bad_env_is_a_config_error() {
        let err = Upstreams::from_env(env(&[("DETAILS_SERVICE_PORT", "http")])).unwrap_err();
        assert!(matches!(err, ConfigError::BadAddress { .. }), "{err}");
    }

    #[test]
    fn addresses_need_a_host_and_take_the_default_port() {
        assert_eq!(parse_authority("127.0.0.1:4000", "x").unwrap().as_str(), "127.0.0.1:4000");
        assert_eq!(parse_authority("[::1]:4000", "x").unwrap().as_str(), "[::1]:4000");
        assert_eq!(parse_authority("ratings", "x").unwrap().as_str(), "ratings:9080");
        for bad in ["", ":80", "a b:80", "host:", "host:0", "host:99999", "u@host:80", "http://host:80"] {
            assert!(parse_authority(bad, "--ratings-addr").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn versions() {
        assert_eq!("v12".parse(), Ok(Version(12)));
        for bad in ["", "v", "1", "V1", "v1a", "v-1", "v99999999999"] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?}");
        }
        let served = |role, v| BookinfoConfig::new(role, v, upstreams()).map(|c| (c.served_by(), c.stars()));
        assert_eq!(served(Role::Reviews, "v1"), Ok(("reviews-v1".into(), Stars::None)));
        assert_eq!(served(Role::Reviews, "v2"), Ok(("reviews-v2".into(), Stars::Colored("black"))));
        assert_eq!(served(Role::Reviews, "v3"), Ok(("reviews-v3".into(), Stars::Colored("red"))));
        assert_eq!(served(Role::Ratings, "v7"), Ok(("ratings-v7".into(), Stars::None)));
        assert_eq!(served(Role::Reviews, "v4"), Err(ConfigError::UnknownReviewsVersion("v4".into())));
    }

    #[test]
    fn flags_win_over_env() {
        let args = BookinfoArgs {
            role: Role::Reviews,
            version: "v2".into(),
            port: DEFAULT_PORT,
            bind: "::".parse().unwrap(),
            details_addr: None,
            reviews_addr: None,
            ratings_addr: Some("127.0.0.1:4321".into()),
            quiet: true,
        };
        let config = BookinfoConfig::from_args(&args, env(&[("RATINGS_HOSTNAME", "elsewhere")])).unwrap();
        assert_eq!(config.upstreams().ratings.as_str(), "127.0.0.1:4321");
        assert_eq!(config.upstreams().details.as_str(), "details:9080");
        let bad = BookinfoArgs { ratings_addr: Some("nope:".into()), ..args };
        let err = BookinfoConfig::from_args(&bad, env(&[])).unwrap_err().to_string();
        assert!(err.contains("--ratings-addr"), "{err}");
    }
}
