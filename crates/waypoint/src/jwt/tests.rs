//! Tokens made here, with a real ES256 key and an HS256 secret, against
//! the rules as the control plane sends them.

use super::*;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

/// An ES256 key: (its JWKS, its encoding key).
fn es256(kid: &str) -> (serde_json::Value, EncodingKey) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = kp.public_key_raw();
    let (x, y) = (URL_SAFE_NO_PAD.encode(&raw[1..33]), URL_SAFE_NO_PAD.encode(&raw[33..65]));
    let jwk = json!({"kty": "EC", "crv": "P-256", "x": x, "y": y, "kid": kid, "alg": "ES256", "use": "sig"});
    (jwk, EncodingKey::from_ec_der(&kp.serialize_der()))
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn token(key: &EncodingKey, kid: &str, claims: serde_json::Value) -> String {
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(kid.into());
    jsonwebtoken::encode(&h, &claims, key).unwrap()
}

fn rule(jwks: serde_json::Value) -> JwtRule {
    JwtRule {
        policy: "shop/jwt".into(),
        issuer: "https://issuer.example".into(),
        audiences: vec!["web".into()],
        jwks: jwks.to_string(),
        ..Default::default()
    }
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::try_from(*k).unwrap(), HeaderValue::try_from(*v).unwrap());
    }
    h
}

#[test]
fn valid_missing_and_invalid_tokens() {
    let (jwk, key) = es256("k1");
    let (_, other_key) = es256("k1");
    let rules = [Arc::new(Prepared::new(&rule(json!({"keys": [jwk]}))))];
    let good = json!({"iss": "https://issuer.example", "sub": "alice", "aud": ["web", "x"], "azp": "cli", "exp": now() + 600,
                      "scope": "read write", "groups": ["eng"], "org": {"unit": "payments"}});
    let t = token(&key, "k1", good.clone());
    let bearer = format!("Bearer {t}");
    let a = authenticate(&rules, &headers(&[("authorization", &bearer)]), "").unwrap().expect("a valid token");
    assert_eq!(a.auth.principal, "https://issuer.example/alice");
    assert_eq!((a.auth.audiences.clone(), a.auth.presenter.as_deref()), (vec!["web".to_string(), "x".to_string()], Some("cli")));
    assert_eq!(a.auth.claim(&["scope".into()]), ["read", "write"], "scope is split at spaces");
    assert_eq!(a.auth.claim(&["org".into(), "unit".into()]), ["payments"]);
    assert_eq!(a.auth.claim(&["groups".into()]), ["eng"]);
    // The token is taken out of the request the app gets.
    let mut h = headers(&[("authorization", &bearer)]);
    a.apply(&mut h);
    assert!(h.get("authorization").is_none());
    // Also from the access_token parameter.
    assert!(authenticate(&rules, &HeaderMap::new(), &format!("x=1&access_token={t}")).unwrap().is_some());
    // No token: no identity, not refused here.
    assert!(authenticate(&rules, &HeaderMap::new(), "").unwrap().is_none());
    assert!(authenticate(&rules, &headers(&[("authorization", "Basic YTpi")]), "").unwrap().is_none(), "another scheme is no token");
    // Refused: 401 for what is not a valid token, 403 for another audience.
    let refused = |h: HeaderMap| authenticate(&rules, &h, "").unwrap_err();
    let with = |claims: serde_json::Value, key: &EncodingKey| format!("Bearer {}", token(key, "k1", claims));
    let cases: Vec<(&str, String, u16)> = vec![
        ("garbage", "Bearer not.a.jwt".into(), 401),
        ("another key", with(good.clone(), &other_key), 401),
        ("another issuer", with(json!({"iss": "https://evil.example", "sub": "a", "aud": "web", "exp": now() + 600}), &key), 401),
        ("no issuer", with(json!({"sub": "a", "aud": "web", "exp": now() + 600}), &key), 401),
        ("expired", with(json!({"iss": "https://issuer.example", "sub": "a", "aud": "web", "exp": now() - 3600}), &key), 401),
        ("not yet", with(json!({"iss": "https://issuer.example", "sub": "a", "aud": "web", "nbf": now() + 3600}), &key), 401),
        ("another audience", with(json!({"iss": "https://issuer.example", "sub": "a", "aud": "other", "exp": now() + 600}), &key), 403),
    ];
    for (what, value, status) in cases {
        assert_eq!(refused(headers(&[("authorization", &value)])).status(), status, "{what}");
    }
    // alg none is no algorithm at all.
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(good.to_string());
    assert_eq!(refused(headers(&[("authorization", &format!("Bearer {header}.{body}."))])).status(), 401);
}

#[test]
fn locations_outputs_and_keys() {
    let (jwk, key) = es256("k1");
    let mut r = rule(json!({"keys": [jwk]}));
    r.from_headers = vec![slipstream_core::route::JwtHeader { name: "x-jwt".into(), prefix: "Token ".into() }];
    r.from_cookies = vec!["session".into()];
    r.output_payload_to_header = Some("x-jwt-payload".into());
    r.output_claim_to_headers = vec![("x-user".into(), "sub".into()), ("x-unit".into(), "org.unit".into())];
    r.forward_original_token = true;
    let rules = [Arc::new(Prepared::new(&r))];
    let t = token(&key, "k1", json!({"iss": "https://issuer.example", "sub": "bob", "aud": "web", "org": {"unit": "ops"}}));
    // The configured locations only: the default one is not read.
    assert!(authenticate(&rules, &headers(&[("authorization", &format!("Bearer {t}"))]), "").unwrap().is_none());
    let a = authenticate(&rules, &headers(&[("x-jwt", &format!("Token {t}"))]), "").unwrap().unwrap();
    let mut h = headers(&[("x-jwt", &format!("Token {t}")), ("x-user", "forged")]);
    strip_outputs(&rules, &mut h);
    assert!(h.get("x-user").is_none(), "a client's own output header is removed");
    a.apply(&mut h);
    assert!(h.get("x-jwt").is_some(), "forwardOriginalToken keeps it");
    assert_eq!((h["x-user"].to_str().unwrap(), h["x-unit"].to_str().unwrap()), ("bob", "ops"));
    let payload: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(h["x-jwt-payload"].as_bytes()).unwrap()).unwrap();
    assert_eq!(payload["sub"], "bob");
    assert!(authenticate(&rules, &headers(&[("cookie", &format!("a=b; session={t}"))]), "").unwrap().is_some());
    // A configured header without its prefix is an invalid token.
    assert_eq!(authenticate(&rules, &headers(&[("x-jwt", &t)]), "").unwrap_err().status(), 401);
    // A JWKS that could not be fetched (empty): every token is refused.
    let none = [Arc::new(Prepared::new(&JwtRule { jwks: String::new(), ..r.clone() }))];
    let e = authenticate(&none, &headers(&[("x-jwt", &format!("Token {t}"))]), "").unwrap_err();
    assert!(e.to_string().contains("could not be obtained"), "{e}");
    // HS256 with an oct key, and a key chosen by kid among several.
    let secret = b"0123456789abcdef0123456789abcdef";
    let (other, _) = es256("k2");
    let oct = json!({"kty": "oct", "k": URL_SAFE_NO_PAD.encode(secret), "kid": "hs", "alg": "HS256"});
    let rules = [Arc::new(Prepared::new(&rule(json!({"keys": [other, oct]}))))];
    let mut h = Header::new(Algorithm::HS256);
    h.kid = Some("hs".into());
    let hs =
        jsonwebtoken::encode(&h, &json!({"iss": "https://issuer.example", "sub": "c", "aud": "web"}), &EncodingKey::from_secret(secret))
            .unwrap();
    assert!(authenticate(&rules, &headers(&[("authorization", &format!("Bearer {hs}"))]), "").unwrap().is_some());
}

/// Review of issue 36: a client must not have one token checked and the
/// application read another. Every token in every place the rule looks is
/// checked, so a forged one beside a valid one is refused wherever it is.
#[test]
fn every_token_of_a_request_is_checked_not_only_the_first() {
    let (jwk, key) = es256("k1");
    let (_, forger) = es256("k1");
    let claims = |sub: &str| json!({"iss": "https://issuer.example", "sub": sub, "aud": "web", "exp": now() + 600});
    let (good, forged) = (token(&key, "k1", claims("alice")), token(&forger, "k1", claims("admin")));
    let bearer = format!("Bearer {good}");
    let rules = [Arc::new(Prepared::new(&rule(json!({"keys": [jwk.clone()]}))))];
    let status = |h: HeaderMap, q: &str| authenticate(&rules, &h, q).map(|_| ()).map_err(|e| e.status());
    // A valid header token and a forged query token (the app may read
    // either): refused, however the parameter's name is written.
    for q in
        [format!("access_token={forged}"), format!("a=1&access%5Ftoken={forged}"), format!("access_token={good}&access_token={forged}")]
    {
        assert_eq!(status(headers(&[("authorization", &bearer)]), &q), Err(401), "{q}");
    }
    // The Authorization header twice, the second forged.
    assert_eq!(status(headers(&[("authorization", &bearer), ("authorization", &format!("Bearer {forged}"))]), ""), Err(401));
    // A lower-case scheme, `;` between parameters: still read, so checked.
    assert_eq!(status(headers(&[("authorization", &format!("bearer {forged}"))]), &format!("access_token={good}")), Err(401));
    assert_eq!(status(headers(&[("authorization", &bearer)]), &format!("a=1;access_token={forged}")), Err(401));
    assert_eq!(status(headers(&[("authorization", &format!("bEaReR {good}"))]), ""), Ok(()));
    // The same valid token in two places is one token: accepted.
    assert_eq!(status(headers(&[("authorization", &bearer)]), &format!("access_token={good}")), Ok(()));
    // A rule's own header sent twice, and its cookie in two headers.
    let mut r = rule(json!({"keys": [jwk]}));
    r.from_headers = vec![slipstream_core::route::JwtHeader { name: "x-jwt".into(), prefix: String::new() }];
    r.from_cookies = vec!["session".into()];
    let own = [Arc::new(Prepared::new(&r))];
    let status = |h: HeaderMap| authenticate(&own, &h, "").map(|_| ()).map_err(|e| e.status());
    assert_eq!(status(headers(&[("x-jwt", &good)])), Ok(()));
    assert_eq!(status(headers(&[("x-jwt", &good), ("x-jwt", &forged)])), Err(401));
    assert_eq!(status(headers(&[("cookie", &format!("session={good}")), ("cookie", &format!("a=b; session={forged}"))])), Err(401));
    assert_eq!(status(headers(&[("cookie", &format!("session={good}; session ={forged}"))])), Err(401), "a name with a space");
}
