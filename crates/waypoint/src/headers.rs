//! What goes on of a request's headers, and what a route's filters change
//! in them: hop-by-hop headers and the caller's claims of identity are
//! dropped, `Host` made one, the version the one the client spoke.

use http::header::{HeaderName, HeaderValue, HOST};
use http::HeaderMap;
use slipstream_core::route::HeaderModifier;

/// Hop-by-hop headers (RFC 9110 section 7.6.1): not forwarded.
const HOP_BY_HOP: &[&str] = &["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"];

/// Headers that say who the caller is: only the mesh may set them, so a
/// client's own are dropped, never passed on as if verified.
const IDENTITY_HEADERS: &[&str] = &["forwarded", "x-forwarded-client-cert", "x-slipstream-peer"];

/// A route filter's changes: `set` replaces, `add` appends, `remove` drops.
pub fn modify(headers: &mut HeaderMap, m: &HeaderModifier) {
    for (k, v) in &m.set {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::try_from(v.as_str())) {
            headers.insert(k, v);
        }
    }
    for (k, v) in &m.add {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::try_from(v.as_str())) {
            headers.append(k, v);
        }
    }
    for k in &m.remove {
        headers.remove(k.as_str());
    }
}

/// The request as it goes to an endpoint: `Host` the rule's rewrite
/// (`rewrite`), else the request's authority (`authority`) when it has
/// not exactly one; hop-by-hop and identity headers dropped; the version
/// HTTP/2 for HTTP/2, else HTTP/1.1; then the rule's `filter`.
pub fn outgoing(parts: &mut http::request::Parts, rewrite: Option<&str>, authority: &str, filter: &HeaderModifier) {
    // HTTP/2 from the client has no Host, and HTTP/1.1 to the endpoint
    // needs exactly one.
    let one_host = {
        let mut all = parts.headers.get_all(HOST).iter();
        all.next().is_some() && all.next().is_none()
    };
    let new_host = match rewrite {
        Some(h) => Some(h),
        None if !one_host => Some(authority),
        None => None,
    };
    if let Some(Ok(v)) = new_host.map(HeaderValue::try_from) {
        parts.headers.insert(HOST, v);
    }
    // Headers the client's `Connection` names are hop-by-hop too.
    let named: Vec<String> = parts
        .headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|h| h.trim().to_ascii_lowercase()).collect::<Vec<_>>())
        .filter(|h| h != "host")
        .collect();
    // gRPC needs `te: trailers` end to end over HTTP/2; any other `te` is
    // hop-by-hop.
    let h2 = parts.version == http::Version::HTTP_2;
    let keep_te = h2 && parts.headers.get(http::header::TE).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    // Most requests have none of them: one pass over the names decides.
    let dropped = |k: &HeaderName| HOP_BY_HOP.contains(&k.as_str()) || IDENTITY_HEADERS.contains(&k.as_str());
    if !named.is_empty() || parts.headers.keys().any(dropped) {
        for h in HOP_BY_HOP.iter().chain(IDENTITY_HEADERS).copied().chain(named.iter().map(String::as_str)) {
            if !(keep_te && h == "te") {
                parts.headers.remove(h);
            }
        }
    }
    // The upstream speaks what the client spoke to the service: HTTP/2
    // (prior knowledge) for HTTP/2, else HTTP/1.1.
    parts.version = if h2 { http::Version::HTTP_2 } else { http::Version::HTTP_11 };
    modify(&mut parts.headers, filter);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(version: http::Version, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().version(version).uri("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    /// A request's version, headers and `Host` rewrite; the headers sent.
    type Case<'a> = (http::Version, &'a [(&'a str, &'a str)], Option<&'a str>, &'a [&'a str]);

    #[test]
    fn what_goes_on_of_the_headers() {
        let none = HeaderModifier::default();
        // (version, headers, rewrite) -> headers sent, sorted.
        let cases: &[Case] = &[
            (http::Version::HTTP_11, &[("host", "a"), ("x", "1")], None, &["host: a", "x: 1"]),
            (http::Version::HTTP_2, &[("x", "1")], None, &["host: svc:80", "x: 1"]),
            (http::Version::HTTP_11, &[("host", "a"), ("host", "b")], None, &["host: svc:80"]),
            (http::Version::HTTP_11, &[("host", "a")], Some("b"), &["host: b"]),
            (
                http::Version::HTTP_11,
                &[("host", "a"), ("connection", "x-hop, host"), ("x-hop", "1"), ("keep-alive", "1"), ("forwarded", "for=me")],
                None,
                &["host: a"],
            ),
            (http::Version::HTTP_2, &[("te", "trailers"), ("x-slipstream-peer", "me")], None, &["host: svc:80", "te: trailers"]),
            (http::Version::HTTP_11, &[("host", "a"), ("te", "trailers")], None, &["host: a"]),
        ];
        for (version, headers, rewrite, want) in cases {
            let mut p = parts(*version, headers);
            outgoing(&mut p, *rewrite, "svc:80", &none);
            let mut got: Vec<String> = p.headers.iter().map(|(k, v)| format!("{k}: {}", v.to_str().unwrap())).collect();
            got.sort();
            assert_eq!(got, *want, "{headers:?}");
            let sent = if *version == http::Version::HTTP_2 { http::Version::HTTP_2 } else { http::Version::HTTP_11 };
            assert_eq!(p.version, sent);
        }
    }
}
