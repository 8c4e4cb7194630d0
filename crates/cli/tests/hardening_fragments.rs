//! Issue 36, item 7: IP fragments are no way around the capture. A pod
//! with NET_RAW crafts, with a raw socket, a SYN to a meshed pod under
//! STRICT split into IP fragments (a first fragment with only 8 bytes of
//! TCP header, then the rest): reassembled by the destination's stack it
//! would reach the app around the node proxy. The eBPF datapath drops
//! TCP to a pod whose header it cannot read whole (`FRAGMENT`), so the
//! fragments get no answer, while the same SYN whole is refused by STRICT
//! with a reset. Nor can such a pod write another source address: its
//! packets leave it only from its own (`SPOOFED`).

mod common;
use common::*;
use std::time::Duration;

const WORLD: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: strict, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: strict, labels: {app: web}}
spec:
  nodeName: node1
  containers: [{name: web, command: [slipstream, app, echo]}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: strict}
spec:
  mtls: {mode: STRICT}
---
apiVersion: v1
kind: Namespace
metadata: {name: outside}
---
apiVersion: v1
kind: Pod
metadata: {name: raw, namespace: outside}
spec:
  nodeName: node2
  containers:
  - name: raw
    command: [sleep, infinity]
    securityContext: {capabilities: {add: [NET_RAW]}}
"#;

/// Python for the pod with NET_RAW: sends a SYN to `argv[1]:argv[2]`,
/// whole or as fragments (`argv[3]`: whole, tiny, split; or whole from
/// the address `argv[4]`, not its own: spoof), from a raw
/// socket, and prints how the destination answered it: `synack` (a
/// listener took it), `rst` (refused), or `none`.
const CRAFT: &str = r#"
import socket, struct, random, sys, time
dst, dport, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); probe.connect((dst, 9)); src = probe.getsockname()[0]
if mode == 'spoof':
    src = sys.argv[4]
sport, seq = random.randint(20000, 60000), random.randint(0, 2**31)
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
mss = struct.pack('!BBH', 2, 4, 1460)
tcp = struct.pack('!HHIIBBHHH', sport, dport, seq, 0, 6 << 4, 0x02, 65535, 0, 0) + mss
pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack('!BBH', 0, 6, len(tcp))
tcp = tcp[:16] + struct.pack('!H', csum(pseudo + tcp)) + tcp[18:]
ident = random.randint(1, 65535)
def ip(payload, frag):
    h = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(payload), ident, frag, 64, 6, 0, socket.inet_aton(src), socket.inet_aton(dst))
    return h[:10] + struct.pack('!H', csum(h)) + h[12:] + payload
if mode in ('whole', 'spoof'):
    packets = [ip(tcp, 0)]
elif mode == 'tiny':
    packets = [ip(tcp[:8], 0x2000), ip(tcp[8:], 1)]
else:
    packets = [ip(tcp[:16], 0x2000), ip(tcp[16:], 2)]
out = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
listen = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP); listen.settimeout(0.2)
for p in packets:
    out.sendto(p, (dst, 0))
end, got = time.time() + 2, 'none'
while time.time() < end:
    try:
        b = listen.recv(65535)
    except socket.timeout:
        continue
    ihl = (b[0] & 15) * 4
    s, d, _, ack, _, flags = struct.unpack('!HHIIBB', b[ihl:ihl + 14])
    if b[12:16] == socket.inet_aton(dst) and s == dport and d == sport and ack == seq + 1:
        if flags & 0x12 == 0x12:
            got = 'synack'; break
        if flags & 0x04:
            got = 'rst'; break
print(got)
"#;

#[test]
fn a_syn_in_ip_fragments_does_not_reach_a_strict_pod_around_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let world = write_manifest(&dir, "world.yaml", WORLD);
    let c = Cluster::up("t-hard-frag", &["-f", &world]);
    let web = c.pods("web")[0]["ip"].as_str().expect("web's address").to_string();
    let craft = |mode: &str| {
        let (code, out) = c.exec("outside", "raw", &["python3", "-c", CRAFT, &web, "8080", mode]);
        assert_eq!(code, 0, "{mode}: {out}");
        out.trim().to_string()
    };
    let ebpf = c.status()["nodes"][0]["datapath"]["mode"] == "ebpf";
    let fragments = || Proxy::of(&c, "node1").metrics().sum("slipstream_datapath_drops_total", &["reason=\"FRAGMENT\""]);
    let before = if ebpf { fragments() } else { 0 };
    // Whole, the SYN reaches the pod's interface and is refused there:
    // STRICT (a reset from the datapath's policy, or the node proxy's).
    assert_eq!(craft("whole"), "rst", "the control: a whole SYN is refused with a reset");
    // In fragments: dropped before the pod's stack could reassemble it;
    // no listener answers (`synack` would be the app, around the mesh).
    for mode in ["tiny", "split"] {
        assert_eq!(craft(mode), "none", "{mode}: a SYN in fragments was answered");
    }
    if ebpf {
        assert!(fragments() >= before + 2, "the fragments were not counted as FRAGMENT drops");
    }
    // Nor can it pass for another address: a packet from an address not
    // its own never leaves it (eBPF datapath: dropped at its eth0, counted).
    if ebpf {
        let spoofed = || Proxy::of(&c, "node2").metrics().sum("slipstream_datapath_drops_total", &["reason=\"SPOOFED\""]);
        let before = spoofed();
        let (code, out) = c.exec("outside", "raw", &["python3", "-c", CRAFT, &web, "8080", "spoof", &web]);
        assert_eq!((code, out.trim()), (0, "none"), "{out}");
        assert_eq!(spoofed(), before + 1, "the spoofed SYN was not dropped at the pod's own interface");
    }
    // Plaintext from outside is refused by STRICT all the same.
    let (code, _) = c.exec("outside", "raw", &["curl", "-sS", "--max-time", "3", &format!("http://{web}:8080/")]);
    assert_ne!(code, 0, "plaintext reached a STRICT pod");
    std::thread::sleep(Duration::from_millis(10));
    c.down();
}
