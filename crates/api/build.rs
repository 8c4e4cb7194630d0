//! Generates the message types and gRPC stubs from `proto/`. The protos are
//! compiled by `protox` (a protobuf compiler written in Rust, with the
//! well-known types built in), so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/envoy/discovery.proto",
        "proto/istio/ca.proto",
        "proto/istio/workload.proto",
        "proto/istio/authorization.proto",
        "proto/slipstream/network_policy.proto",
        "proto/slipstream/route.proto",
        "proto/slipstream/mesh.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    // BTreeMap for map fields: encoding is then deterministic, so a
    // resource's version can be a hash of its bytes (the same on every
    // control plane replica and across restarts).
    tonic_prost_build::configure().btree_map(".").build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
