//! Two network namespaces joined by a veth pair, for the tests that run programs on two
//! "hosts": named after the test's tag and pid (so parallel runs do not collide), removed
//! when dropped.

use std::process::Command;

/// Runs `ip ARGS`; its stderr is the error.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Namespaces `a` (SUBNET.1) and `b` (SUBNET.2) joined by a veth (`veth_a` in a, `veth_b`
/// in b), loopback up in both; deleted on drop.
pub struct VethPair {
    pub a: String,
    pub b: String,
    pub ip_a: String,
    pub ip_b: String,
    pub veth_a: String,
    pub veth_b: String,
}

impl VethPair {
    /// `tag` names the namespaces (`rdmxibv-TAG-a-PID`); `short` (at most 4 characters)
    /// names the veth ends within the kernel's 15; `subnet` is the /24's first three
    /// octets; `mtu` sets both ends' MTU (None: the veth default, 1500).
    pub fn new(tag: &str, short: &str, subnet: &str, mtu: Option<u32>) -> Result<Self, String> {
        let pid = std::process::id();
        let pair = VethPair {
            a: format!("rdmxibv-{tag}-a-{pid}"),
            b: format!("rdmxibv-{tag}-b-{pid}"),
            ip_a: format!("{subnet}.1"),
            ip_b: format!("{subnet}.2"),
            veth_a: format!("{short}a{}", pid % 100_000),
            veth_b: format!("{short}b{}", pid % 100_000),
        };
        ip(&["netns", "add", &pair.a])?;
        ip(&["netns", "add", &pair.b])?;
        ip(&[
            "link",
            "add",
            &pair.veth_a,
            "type",
            "veth",
            "peer",
            "name",
            &pair.veth_b,
        ])?;
        ip(&["link", "set", &pair.veth_a, "netns", &pair.a])?;
        ip(&["link", "set", &pair.veth_b, "netns", &pair.b])?;
        for (ns, dev, addr) in [
            (&pair.a, &pair.veth_a, &pair.ip_a),
            (&pair.b, &pair.veth_b, &pair.ip_b),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            if let Some(mtu) = mtu {
                ip(&["-n", ns, "link", "set", dev, "mtu", &mtu.to_string()])?;
            }
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}
