//! Request paths normalized as Istio's proxies normalize them
//! (`meshConfig.pathNormalization`), so that a route or a policy written
//! for `/admin` sees `/public/../admin` as `/admin`, and the app receives
//! the path the policy saw.
//!
//! What each mode does, in this order (Envoy's `normalize_path`,
//! `merge_slashes` and `path_with_escaped_slashes_action`, as Istio sets
//! them for every proxy, waypoints included):
//!
//! 1. `DECODE_AND_MERGE_SLASHES` only: `%2F`, `%2f` become `/` and `%5C`,
//!    `%5c` become `\`, once.
//! 2. `BASE` and up: `%2D %2E %30-%39 %41-%5A %5F %61-%7A %7E` (the
//!    unreserved characters) are decoded exactly once; every other escape
//!    is kept as written (its hex case too: `%25` is never decoded, so
//!    nothing is decoded twice); `%00` is refused (400); `\` becomes `/`;
//!    a dot segment with parameters (`..;x`, `.;x`) counts as the dot
//!    segment (Envoy's fix for CVE-2026-73551, in the Envoy that Istio
//!    1.29.7 and later ship: an app that drops `;` parameters would
//!    otherwise climb past a policy); then `.` and `..` segments are
//!    resolved (an empty segment counts, `..` never climbs above `/`).
//! 3. `MERGE_SLASHES` and up: runs of `/` become one.
//!
//! `NONE` leaves the path as it came. In every mode the query is not
//! touched and a `#fragment` is dropped (the HTTP parser does that before
//! this code sees the path). Case is never changed, and `;` parameters
//! elsewhere are kept: what Istio leaves to the app (docs/security.md).

use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// `meshConfig.pathNormalization.normalization`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum PathNormalization {
    /// Paths are used as they come.
    None,
    /// RFC 3986 normalization: Istio's default (`DEFAULT` reads as this).
    #[default]
    Base,
    /// `Base`, then runs of slashes merged.
    MergeSlashes,
    /// Escaped slashes and backslashes decoded first, then
    /// `MergeSlashes`: the strictest, what Istio advises when traffic is
    /// allowed by default.
    DecodeAndMergeSlashes,
}

impl PathNormalization {
    /// Istio's enum names (`DEFAULT` is `BASE`).
    pub const NAMES: [&'static str; 5] = ["DEFAULT", "NONE", "BASE", "MERGE_SLASHES", "DECODE_AND_MERGE_SLASHES"];

    pub fn parse(s: &str) -> Option<PathNormalization> {
        Some(match s {
            "DEFAULT" | "BASE" => PathNormalization::Base,
            "NONE" => PathNormalization::None,
            "MERGE_SLASHES" => PathNormalization::MergeSlashes,
            "DECODE_AND_MERGE_SLASHES" => PathNormalization::DecodeAndMergeSlashes,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PathNormalization::None => "NONE",
            PathNormalization::Base => "BASE",
            PathNormalization::MergeSlashes => "MERGE_SLASHES",
            PathNormalization::DecodeAndMergeSlashes => "DECODE_AND_MERGE_SLASHES",
        }
    }
}

/// Why a path cannot be normalized: answered 400 before any route or
/// policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path holds an encoded NUL (%00)")]
    EncodedNul,
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The byte `%HH` at the start of `b` stands for, if it is an escape.
fn escaped(b: &[u8]) -> Option<u8> {
    match b {
        [b'%', h, l, ..] => Some(hex(*h)? << 4 | hex(*l)?),
        _ => None,
    }
}

/// Decoded by `BASE`: the unreserved characters (RFC 3986 section 2.3),
/// the dot among them.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Whether `mode` could change `path` at all: most paths have no escape,
/// no backslash, no dot segment and no empty segment, and are returned as
/// they are without a copy.
fn untouched(path: &[u8], mode: PathNormalization) -> bool {
    let merge = matches!(mode, PathNormalization::MergeSlashes | PathNormalization::DecodeAndMergeSlashes);
    !path.iter().any(|b| matches!(b, b'%' | b'\\'))
        && !path.windows(2).any(|w| w == b"/." || (merge && w == b"//"))
        && path.first() == Some(&b'/')
}

/// `path` (the path part of a request target: no query, no fragment) as
/// `mode` normalizes it.
pub fn normalize(path: &str, mode: PathNormalization) -> Result<Cow<'_, str>, PathError> {
    if mode == PathNormalization::None || path == "*" || untouched(path.as_bytes(), mode) {
        return Ok(Cow::Borrowed(path));
    }
    let mut src = path.as_bytes().to_vec();
    if mode == PathNormalization::DecodeAndMergeSlashes {
        src = decode_slashes(&src);
    }
    let decoded = decode_unreserved(&src)?;
    let mut out = remove_dot_segments(&decoded);
    if mode != PathNormalization::Base {
        out.dedup_by(|a, b| *a == b'/' && *b == b'/');
    }
    // Only ASCII was changed, never part of a longer UTF-8 sequence.
    Ok(Cow::Owned(String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())))
}

/// Step 1: `%2F %2f` to `/`, `%5C %5c` to `\`, once.
fn decode_slashes(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len());
    let mut i = 0;
    while i < src.len() {
        match escaped(&src[i..]) {
            Some(b @ (b'/' | b'\\')) => {
                out.push(b);
                i += 3;
            }
            _ => {
                out.push(src[i]);
                i += 1;
            }
        }
    }
    out
}

/// Step 2, its first half: unreserved escapes decoded, other escapes kept
/// as written, `%00` refused, `\` to `/`, a leading `/` ensured.
fn decode_unreserved(src: &[u8]) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(src.len() + 1);
    if src.first() != Some(&b'/') && src.first() != Some(&b'\\') {
        out.push(b'/');
    }
    let mut i = 0;
    while i < src.len() {
        match escaped(&src[i..]) {
            Some(0) => return Err(PathError::EncodedNul),
            Some(b) if unreserved(b) => {
                out.push(b);
                i += 3;
            }
            Some(_) => {
                out.extend_from_slice(&src[i..i + 3]);
                i += 3;
            }
            None => {
                out.push(if src[i] == b'\\' { b'/' } else { src[i] });
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Step 2, its second half: `.` and `..` segments resolved (RFC 3986
/// section 5.2.4; an empty segment is a segment, `..` stops at the root),
/// `..;x` and `.;x` read as `..` and `.`. `path` starts with `/`.
fn remove_dot_segments(path: &[u8]) -> Vec<u8> {
    let segments: Vec<&[u8]> = path[1..].split(|b| *b == b'/').collect();
    let last = segments.len() - 1;
    let mut kept: Vec<&[u8]> = Vec::with_capacity(segments.len());
    for (i, seg) in segments.into_iter().enumerate() {
        let dots = if seg.starts_with(b"..;") || seg == b".." {
            2
        } else if seg.starts_with(b".;") || seg == b"." {
            1
        } else {
            0
        };
        if dots == 2 {
            kept.pop();
        }
        if dots == 0 {
            kept.push(seg);
        } else if i == last {
            // `/a/..` and `/a/.` end with a slash.
            kept.push(b"");
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for seg in kept {
        out.push(b'/');
        out.extend_from_slice(seg);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::PathNormalization::*;
    use super::*;

    /// Istio's own acceptance table: the expected output of
    /// `tests/integration/security/normalization_test.go` (istio/istio,
    /// identical on master and release-1.29 to 1.31), every row of every
    /// group, with the fragment already dropped as the HTTP parser drops
    /// it (`/app#foo` reaches this code as `/app`). `Err` is Istio's 400.
    /// One row differs, on purpose: `/..;/admin`, which that test expects
    /// unchanged and Envoy since 1.38.4 and 1.39.1 (Istio 1.29.7 and later,
    /// CVE-2026-73551) reads as `/admin`.
    #[test]
    fn istios_normalization_table_every_row_and_mode() {
        let common: &[(&str, [&str; 4])] = &[
            // input: NONE, BASE, MERGE_SLASHES, DECODE_AND_MERGE_SLASHES
            ("/", ["/", "/", "/", "/"]),
            ("/app/", ["/app/", "/app/", "/app/", "/app/"]),
            ("/app/../admin", ["/app/../admin", "/admin", "/admin", "/admin"]),
            ("/app", ["/app", "/app", "/app", "/app"]),
            ("/app//", ["/app//", "/app//", "/app/", "/app/"]),
            ("/app/%2f", ["/app/%2f", "/app/%2f", "/app/%2f", "/app/"]),
            ("/app%2f/", ["/app%2f/", "/app%2f/", "/app%2f/", "/app/"]),
            ("/xyz%30..//abc", ["/xyz%30..//abc", "/xyz0..//abc", "/xyz0../abc", "/xyz0../abc"]),
            ("/app/%2E./admin", ["/app/%2E./admin", "/admin", "/admin", "/admin"]),
            ("/app\\admin", ["/app\\admin", "/app/admin", "/app/admin", "/app/admin"]),
            ("/app/\\/\\/\\admin", ["/app/\\/\\/\\admin", "/app//////admin", "/app/admin", "/app/admin"]),
            ("/%2Fapp%5cadmin%5Cabc", ["/%2Fapp%5cadmin%5Cabc", "/%2Fapp%5cadmin%5Cabc", "/%2Fapp%5cadmin%5Cabc", "/app/admin/abc"]),
            (
                "/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\\abc",
                [
                    "/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\\abc",
                    "/%5Capp%2f%5c%2F..%2fadmin%5c/abc",
                    "/%5Capp%2f%5c%2F..%2fadmin%5c/abc",
                    "/app/admin/abc",
                ],
            ),
            ("/app//../admin", ["/app//../admin", "/app/admin", "/app/admin", "/app/admin"]),
            ("/app//../../admin", ["/app//../../admin", "/admin", "/admin", "/admin"]),
        ];
        let modes = [None, Base, MergeSlashes, DecodeAndMergeSlashes];
        for (input, want) in common {
            for (mode, want) in modes.iter().zip(want) {
                assert_eq!(normalize(input, *mode).as_deref(), Ok(*want), "{input} in {mode:?}");
            }
        }
        // DECODE_AND_MERGE_SLASHES only.
        let decode: &[(&str, &str)] = &[
            ("/%c0%2e%c0%2e/admin", "/%c0.%c0./admin"),
            ("/%c0%2fadmin", "/%c0/admin"),
            // "NotNormalized": what no mode may change.
            ("/0x2e0x2e/admin", "/0x2e0x2e/admin"),
            ("/0x2e0x2e0x2fadmin", "/0x2e0x2e0x2fadmin"),
            ("/0x2e0x2e0x5cadmin", "/0x2e0x2e0x5cadmin"),
            ("/0x2f0x2fadmin", "/0x2f0x2fadmin"),
            ("/0x5c0x5cadmin", "/0x5c0x5cadmin"),
            ("/%25c0%25ae%25c1%259cadmin", "/%25c0%25ae%25c1%259cadmin"),
            ("/%25c0%25ae%25c0%25ae/admin", "/%25c0%25ae%25c0%25ae/admin"),
            ("/%25c0%25afadmin", "/%25c0%25afadmin"),
            ("/%25c1%259cadmin", "/%25c1%259cadmin"),
            ("/%252e%252e/admin", "/%252e%252e/admin"),
            ("/%252e%252e%252fadmin", "/%252e%252e%252fadmin"),
            ("/%c1%9cadmin", "/%c1%9cadmin"),
            ("/%c0%ae%c0%ae/admin", "/%c0%ae%c0%ae/admin"),
            ("/%c0%afadmin", "/%c0%afadmin"),
            ("/.../admin", "/.../admin"),
            ("/..../admin", "/..../admin"),
            // The one row that differs from Istio's test (see above).
            ("/..;/admin", "/admin"),
            ("/;/admin", "/;/admin"),
            ("/admin;a=b", "/admin;a=b"),
            ("/admin;a=b/xyz", "/admin;a=b/xyz"),
            ("/admin,a=b/xyz", "/admin,a=b/xyz"),
            ("/Admin", "/Admin"),
            ("/ADMIN", "/ADMIN"),
        ];
        for (input, want) in decode {
            assert_eq!(normalize(input, DecodeAndMergeSlashes).as_deref(), Ok(*want), "{input}");
        }
        // "Invalid".
        assert_eq!(normalize("/admin%00", DecodeAndMergeSlashes), Err(PathError::EncodedNul));
        assert_eq!(normalize("/admin%00", Base), Err(PathError::EncodedNul));
        assert_eq!(normalize("/admin%00", None).as_deref(), Ok("/admin%00"), "NONE changes nothing");
        // "PercentEncoded": `/admin%XX` for every byte 01 to ff.
        for i in 1u8..=0xff {
            let input = format!("/admin%{i:02x}");
            let want = match i {
                b'\\' | b'/' => "/admin/".to_string(),
                b'-' | b'.' | b'_' | b'~' | b'0'..=b'9' | b'A'..=b'Z' | b'a'..=b'z' => format!("/admin{}", i as char),
                _ => input.clone(),
            };
            assert_eq!(normalize(&input, DecodeAndMergeSlashes).as_deref(), Ok(want.as_str()), "{input}");
        }
    }

    #[test]
    fn istios_authorization_normalization_cases_and_envoys_parameter_fix() {
        // TestAuthz_PathNormalization (BASE): only /public stays public.
        for p in ["/public", "/public/../public"] {
            assert_eq!(normalize(p, Base).as_deref(), Ok("/public"), "{p}");
        }
        for p in [
            "/private",
            "/public/../private",
            "/public/./../private",
            "/public/.././private",
            "/public/%2E%2E/private",
            "/public/%2e%2e/private",
            "/public/%2E/%2E%2E/private",
            "/public/%2e/%2e%2e/private",
            "/public/%2E%2E/%2E/private",
            "/public/%2e%2e/%2e/private",
        ] {
            assert_eq!(normalize(p, Base).as_deref(), Ok("/private"), "{p}");
        }
        // Envoy's unit rows for dot segments with parameters.
        for (p, want) in [
            ("/xyz/..;foo=bar/abc", "/abc"),
            ("/..;foo=bar/abc", "/abc"),
            ("/xyz/..;foo=bar", "/"),
            ("/xyz/.;foo=bar/abc", "/xyz/abc"),
            ("/xyz/.;foo=bar", "/xyz/"),
            ("/xyz/..;foo=bar/.;fff=zzz/remain;blah-bluh", "/remain;blah-bluh"),
            ("/xyz/...;foo", "/xyz/...;foo"),
            ("/a/b/../../../../c", "/c"),
            ("/a/..\\c", "/c"),
            ("/a/%2F%2f/c", "/a/%2F%2f/c"),
        ] {
            assert_eq!(normalize(p, Base).as_deref(), Ok(want), "{p}");
        }
        // A path with nothing to do is not copied.
        assert!(matches!(normalize("/reviews/0", MergeSlashes), Ok(Cow::Borrowed(_))));
        assert!(matches!(normalize("*", DecodeAndMergeSlashes), Ok(Cow::Borrowed("*"))));
        assert_eq!(PathNormalization::parse("DEFAULT"), Some(Base));
        assert_eq!(PathNormalization::parse("decode_and_merge_slashes"), Option::None, "Istio's names are upper case");
        for name in PathNormalization::NAMES {
            let m = PathNormalization::parse(name).unwrap();
            assert_eq!(PathNormalization::parse(m.as_str()), Some(m));
        }
    }
}
