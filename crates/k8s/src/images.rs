//! Well-known sample images, run as the applications built into
//! `slipstream` (the local cluster pulls no image): Istio's bookinfo and
//! helloworld, curl, fortio, httpbin and the echo servers the field's
//! tutorials use. A container that names one of these images and no
//! `command` runs what the image would run; its `args` are passed as the
//! image's entrypoint would take them. Pure and table-tested; the table
//! users read is docs/images.md.

/// What a sample image runs here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Builtin {
    /// The argv: the image's entrypoint and arguments, as a process here.
    pub argv: Vec<String>,
}

/// The repository of an image reference, without registry, tag or digest
/// (`docker.io/istio/examples-bookinfo-reviews-v2:1.20.2` ->
/// `istio/examples-bookinfo-reviews-v2`; `library/` dropped).
pub fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    // A tag is after the last ':' that follows the last '/'.
    let slash = no_digest.rfind('/').map_or(0, |i| i + 1);
    let no_tag = match no_digest[slash..].find(':') {
        Some(i) => &no_digest[..slash + i],
        None => no_digest,
    };
    // A registry is a first component with a '.' or ':', or `localhost`.
    let repo = match no_tag.split_once('/') {
        Some((first, rest)) if first.contains('.') || first.contains(':') || first == "localhost" => rest,
        _ => no_tag,
    };
    repo.strip_prefix("library/").unwrap_or(repo)
}

fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// The process for a container of `image` with no `command` and these
/// `args`; None for an image not in the table.
pub fn builtin(image: &str, args: &[String]) -> Option<Builtin> {
    let repo = repository(image);
    let with_args = |entry: &[&str], default: &[&str]| {
        let mut v = argv(entry);
        if args.is_empty() {
            v.extend(argv(default));
        } else {
            v.extend(args.iter().cloned());
        }
        Builtin { argv: v }
    };
    // Istio's bookinfo: one image per service and version.
    if let Some(rest) = repo.strip_prefix("istio/examples-bookinfo-") {
        let (role, version) = rest.split_once("-v")?;
        let version = version.split('-').next().filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))?;
        if !["details", "ratings", "reviews", "productpage"].contains(&role) {
            return None;
        }
        return Some(Builtin { argv: argv(&["slipstream", "app", "bookinfo", "--role", role, "--version", &format!("v{version}")]) });
    }
    // Istio's helloworld: GET /hello on 5000 names the version and the pod.
    if let Some(version) = repo.strip_prefix("istio/examples-helloworld-") {
        if version.starts_with('v') && version[1..].bytes().all(|b| b.is_ascii_digit()) && version.len() > 1 {
            return Some(Builtin {
                argv: argv(&["slipstream", "app", "echo", "--http-port", "5000", "--tcp-port", "0", "--hello-version", version]),
            });
        }
        return None;
    }
    match repo {
        // curl's image: its entrypoint is curl.
        "curlimages/curl" => Some(with_args(&["curl"], &[])),
        // Images the field uses as a shell to exec into.
        "nicolaka/netshoot" | "governmentpaas/curl-ssl" | "istio/base" => Some(with_args(&["sleep"], &["infinity"])),
        // fortio: `server` unless told otherwise.
        "fortio/fortio" => Some(with_args(&["fortio"], &["server"])),
        // httpbin on port 80 (Istio's sample), go-httpbin on 8080.
        "kong/httpbin" | "kennethreitz/httpbin" | "citizenstig/httpbin" => {
            Some(Builtin { argv: argv(&["slipstream", "app", "echo", "--http-port", "80", "--tcp-port", "0"]) })
        }
        "mccutchen/go-httpbin" => Some(Builtin { argv: argv(&["slipstream", "app", "echo", "--http-port", "8080", "--tcp-port", "0"]) }),
        // Gateway API's conformance echo server (port 3000).
        "k8s-staging-gateway-api/echo-basic" | "k8s-staging-ingressconformance/echoserver" => {
            Some(Builtin { argv: argv(&["slipstream", "app", "echo", "--http-port", "3000", "--tcp-port", "0"]) })
        }
        // hashicorp's http-echo: `-text=...` answered on `-listen` (:5678).
        "hashicorp/http-echo" => {
            let mut v = argv(&["slipstream", "app", "echo", "--tcp-port", "0", "--http-port"]);
            let flag = |name: &str| {
                args.iter().find_map(|a| a.trim_start_matches('-').strip_prefix(name).and_then(|r| r.strip_prefix('=')).map(String::from))
            };
            let port = flag("listen").and_then(|l| l.rsplit(':').next().map(String::from)).unwrap_or_else(|| "5678".into());
            v.push(port);
            v.push("--text".into());
            v.push(flag("text").unwrap_or_else(|| "hello-world".into()));
            Some(Builtin { argv: v })
        }
        // Our own echo server's image name, for manifests written for us.
        "slipstream/echo" => Some(with_args(&["slipstream", "app", "echo"], &[])),
        _ => None,
    }
}

/// The images of the table, for error messages.
pub const KNOWN: &str = "istio/examples-bookinfo-{details,ratings,reviews,productpage}-vN, istio/examples-helloworld-vN, \
curlimages/curl, nicolaka/netshoot, fortio/fortio, kong/httpbin, kennethreitz/httpbin, mccutchen/go-httpbin, \
hashicorp/http-echo, k8s-staging-gateway-api/echo-basic";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories() {
        let cases = [
            ("docker.io/istio/examples-bookinfo-reviews-v2:1.20.2", "istio/examples-bookinfo-reviews-v2"),
            ("istio/examples-bookinfo-details-v1", "istio/examples-bookinfo-details-v1"),
            ("curlimages/curl@sha256:abcd", "curlimages/curl"),
            ("localhost:5000/fortio/fortio:latest", "fortio/fortio"),
            ("gcr.io/k8s-staging-gateway-api/echo-basic:v20231214-v1.0.0-140-gf544a46e", "k8s-staging-gateway-api/echo-basic"),
            ("docker.io/library/nginx:1.27", "nginx"),
            ("nginx", "nginx"),
        ];
        for (image, want) in cases {
            assert_eq!(repository(image), want, "{image}");
        }
    }

    #[test]
    fn the_table() {
        let run =
            |image: &str, args: &[&str]| builtin(image, &args.iter().map(|s| s.to_string()).collect::<Vec<_>>()).map(|b| b.argv.join(" "));
        let cases: &[(&str, &[&str], Option<&str>)] = &[
            ("docker.io/istio/examples-bookinfo-reviews-v3:1.20.2", &[], Some("slipstream app bookinfo --role reviews --version v3")),
            ("istio/examples-bookinfo-productpage-v1", &[], Some("slipstream app bookinfo --role productpage --version v1")),
            ("istio/examples-bookinfo-ratings-v2-mysql:1.20", &[], Some("slipstream app bookinfo --role ratings --version v2")),
            ("istio/examples-bookinfo-mongodb:1.20", &[], None),
            ("istio/examples-bookinfo-reviews-vx", &[], None),
            (
                "docker.io/istio/examples-helloworld-v2:1.0",
                &[],
                Some("slipstream app echo --http-port 5000 --tcp-port 0 --hello-version v2"),
            ),
            ("curlimages/curl:8.10.1", &["-s", "http://httpbin:8000/get"], Some("curl -s http://httpbin:8000/get")),
            ("fortio/fortio:latest", &[], Some("fortio server")),
            ("fortio/fortio", &["load", "-c", "8", "http://x"], Some("fortio load -c 8 http://x")),
            ("docker.io/kong/httpbin:0.1.0", &[], Some("slipstream app echo --http-port 80 --tcp-port 0")),
            ("hashicorp/http-echo", &["-text=bar", "-listen=:8080"], Some("slipstream app echo --tcp-port 0 --http-port 8080 --text bar")),
            ("hashicorp/http-echo:1.0", &[], Some("slipstream app echo --tcp-port 0 --http-port 5678 --text hello-world")),
            ("nicolaka/netshoot", &[], Some("sleep infinity")),
            ("nginx:1.27", &[], None),
        ];
        for (image, args, want) in cases {
            assert_eq!(run(image, args).as_deref(), *want, "{image} {args:?}");
        }
    }
}
