//! `decide` as a table: the checks in their order, the route, the rate
//! limit only for what would be routed, and the draws of a forwarded
//! request.

use super::*;
use slipstream_core::policy::PolicyRule;
use slipstream_core::route::traffic::{Fault, FaultAbort, FaultDelay, Retry, TrafficPolicy};
use slipstream_core::route::{Backend, Filters};
use std::cell::Cell;

fn verdict(allowed: bool) -> L7Verdict {
    let by = PolicyRule::new(slipstream_core::policy::PolicyKind::AuthorizationPolicy, "shop", "allow-web", None);
    L7Verdict { allowed, by: Some(by), dry_run_denials: vec![] }
}

fn forward(fault: Option<Fault>, retry: Option<Retry>) -> plan::Forward {
    plan::Forward {
        service: None,
        candidates: vec![],
        pool: "shop/cart".into(),
        traffic: TrafficPolicy::default(),
        path_and_query: "/".into(),
        host: None,
        timeout: Some(Duration::from_secs(3)),
        attempt_timeout: Some(Duration::from_secs(1)),
        retry,
        fault,
    }
}

/// What the route decision gave.
#[derive(Clone)]
enum Route {
    Forward,
    Redirect,
    Unmatched,
    Unready,
}

fn action(r: &Route) -> Action {
    match r {
        Route::Forward => Action::Forward(Box::new(forward(None, None))),
        Route::Redirect => Action::Redirect { status: 301, location: "https://shop/".into() },
        Route::Unmatched => Action::Respond { status: 404, flag: Flag::NoRoute, detail: "no route".into() },
        Route::Unready => Action::Respond { status: 503, flag: Flag::NoHealthyUpstream, detail: "no endpoint".into() },
    }
}

/// A request: path refused, token refused, allowed, route, limited.
type Case<'a> = (Option<PathError>, Option<&'a JwtError>, bool, Route, bool);
/// Its decision: answer, flag, policy, routed, limit asked.
type Decided = (String, Flag, String, bool, bool);

/// One request's decision as `(status or what is done, flag, policy)`,
/// with whether the route and the limit were asked.
fn run(path: Option<PathError>, jwt: Option<&JwtError>, allowed: bool, route: Route, limited: bool) -> Decided {
    let rule = RouteRule { name: "shop/cart.0".into(), ..Default::default() };
    let authz = verdict(allowed);
    let (routed, asked) = (Cell::new(false), Cell::new(false));
    let d = decide(
        Checks { path, jwt, authz: &authz },
        || {
            routed.set(true);
            plan::Decision { rule: Some(&rule), action: action(&route) }
        },
        |r| {
            asked.set(true);
            assert_eq!(r, Some("shop/cart.0"));
            if limited {
                Err(("shop/ten-a-second".into(), Duration::from_millis(1500)))
            } else {
                Ok(())
            }
        },
        Draws::default,
    );
    let (what, flag) = match &d.then {
        Then::Refuse(r) => (r.status().to_string(), r.flag()),
        Then::Redirect { status, .. } => (format!("redirect {status}"), Flag::None),
        Then::Forward(_) => ("forward".into(), Flag::None),
    };
    (what, flag, d.policy.unwrap_or_else(|| "-".into()), routed.get(), asked.get())
}

#[test]
fn the_checks_come_in_order_and_the_limit_only_for_what_would_be_routed() {
    let bad = JwtError::Invalid { policy: "shop/jwt".into(), why: "expired".into() };
    let aud = JwtError::Audience { policy: "shop/jwt".into() };
    let nul = Some(PathError::EncodedNul);
    let s = |x: &str| x.to_string();
    #[rustfmt::skip]
    let table: Vec<(Case, Decided)> = vec![
        // path, jwt, allowed, route, limited -> answer, flag, policy, routed, limit asked
        ((nul, Some(&bad), false, Route::Forward, false), (s("400"), Flag::DownstreamProtocolError, s("shop/allow-web"), false, false)),
        ((None, Some(&bad), false, Route::Forward, false), (s("401"), Flag::None, s("shop/jwt"), false, false)),
        ((None, Some(&aud), true, Route::Forward, false), (s("403"), Flag::None, s("shop/jwt"), false, false)),
        ((None, Option::None, false, Route::Forward, true), (s("403"), Flag::Rbac, s("shop/allow-web"), false, false)),
        ((None, Option::None, true, Route::Forward, false), (s("forward"), Flag::None, s("shop/allow-web"), true, true)),
        ((None, Option::None, true, Route::Forward, true), (s("429"), Flag::RateLimited, s("shop/ten-a-second"), true, true)),
        ((None, Option::None, true, Route::Redirect, false), (s("redirect 301"), Flag::None, s("shop/allow-web"), true, true)),
        ((None, Option::None, true, Route::Redirect, true), (s("429"), Flag::RateLimited, s("shop/ten-a-second"), true, true)),
        ((None, Option::None, true, Route::Unmatched, true), (s("404"), Flag::NoRoute, s("shop/allow-web"), true, false)),
        ((None, Option::None, true, Route::Unready, true), (s("503"), Flag::NoHealthyUpstream, s("shop/allow-web"), true, false)),
    ];
    for ((path, jwt, allowed, route, limited), want) in table {
        assert_eq!(run(path, jwt, allowed, route, limited), want, "{path:?} {jwt:?} allowed={allowed} limited={limited}");
    }
}

#[test]
fn refusals_say_why_and_a_rate_limit_when_to_come_back() {
    let cases = [
        (Refusal::Path(PathError::EncodedNul), 400, "path refused: the path holds an encoded NUL (%00)\n", None),
        (Refusal::Denied, 403, "RBAC: access denied\n", None),
        (Refusal::RateLimited { wait: Duration::from_millis(1500) }, 429, "local_rate_limited\n", Some(2)),
        (Refusal::RateLimited { wait: Duration::from_secs(3) }, 429, "local_rate_limited\n", Some(3)),
        (Refusal::RateLimited { wait: Duration::ZERO }, 429, "local_rate_limited\n", Some(1)),
        (Refusal::Route { status: 404, flag: Flag::NoRoute, detail: "no route of x".into() }, 404, "no route of x\n", None),
    ];
    for (r, status, body, after) in cases {
        assert_eq!((r.status(), r.body().as_str(), r.retry_after()), (status, body, after), "{r:?}");
    }
}

#[test]
fn a_forwarded_request_carries_its_attempts_policy_and_its_draws() {
    let fault = Fault {
        delay: Some(FaultDelay { per_million: 500_000, delay: Duration::from_millis(7) }),
        abort: Some(FaultAbort { per_million: 250_000, status: 418 }),
    };
    let retry = Retry { attempts: 2, per_try_timeout: None, on: Default::default() };
    let mirrored = Filters {
        mirrors: vec![Backend { service: "shop/cart-v2".into(), port: 0, weight: 1, subset: None }],
        mirror_per_million: Some(100_000),
        ..Default::default()
    };
    // (mirror filters, draws) -> (mirror, delay, abort)
    let draws = |m, d, a| Draws { mirror: m, delay: d, abort: a };
    let table = [
        (Filters::default(), draws(0, 0, 0), (false, Some(Duration::from_millis(7)), Some(418))),
        (mirrored.clone(), draws(99_999, 499_999, 249_999), (true, Some(Duration::from_millis(7)), Some(418))),
        (mirrored.clone(), draws(100_000, 500_000, 250_000), (false, None, None)),
        (
            Filters { mirror_per_million: None, ..mirrored.clone() },
            draws(999_999, 0, 999_999),
            (true, Some(Duration::from_millis(7)), None),
        ),
    ];
    for (filters, draws, (mirror, delay, abort)) in table {
        let rule = RouteRule { name: "shop/cart.0".into(), filters, ..Default::default() };
        let authz = verdict(true);
        let f = forward(Some(fault.clone()), Some(retry.clone()));
        let d = decide(
            Checks { path: None, jwt: None, authz: &authz },
            || plan::Decision { rule: Some(&rule), action: Action::Forward(Box::new(f)) },
            |_| Ok(()),
            || draws,
        );
        let Then::Forward(f) = d.then else { panic!("not forwarded") };
        let want =
            Attempts { retries: 2, per_try: Some(Duration::from_secs(1)), overall: Some(Duration::from_secs(3)), mirror, delay, abort };
        assert_eq!(f.attempts, want, "{draws:?}");
    }
    // Without a retry policy: one attempt.
    let authz = verdict(true);
    let d = decide(
        Checks { path: None, jwt: None, authz: &authz },
        || plan::Decision { rule: None, action: Action::Forward(Box::new(forward(None, None))) },
        |_| Ok(()),
        || -> Draws { panic!("drew for a request with no fault and no mirror") },
    );
    let Then::Forward(f) = d.then else { panic!("not forwarded") };
    assert_eq!((f.attempts.retries, f.attempts.mirror, f.attempts.delay, f.attempts.abort), (0, false, None, None));
}
