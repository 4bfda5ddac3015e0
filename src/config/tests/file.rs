//! The ceph.conf-like file format.

use super::failure;
use crate::config::{Config, Source};
use crate::error::ErrorKind;

#[test]
fn keys_comments_blank_lines_and_spaces() {
    let text = "\
# whole-line comment
; another one

rnr_retry = 3
min rnr timer = 14   # trailing comment
timeout=12;trailing
  Max-Send-WR   =   512  
device = mlx5_0 ; the NIC
";
    let mut config = Config::new();
    config.load_str(text, "/etc/x.conf").unwrap();
    assert_eq!(config.get("rnr_retry").unwrap(), "3");
    assert_eq!(config.get("min_rnr_timer").unwrap(), "14");
    assert_eq!(config.get("timeout").unwrap(), "12");
    assert_eq!(config.get("max_send_wr").unwrap(), "512");
    assert_eq!(config.get("device").unwrap(), "mlx5_0");
    assert_eq!(config.source("rnr_retry").unwrap(), Source::File);
}

#[test]
fn sections_global_and_rdmx_apply_others_are_skipped() {
    let text = "\
sl = 1
[global]
port = 2
[osd.0]
port = 9
ms_async_rdma_unknown_here = whatever
[ RDMX ]  # comment
gid_index = 3
[client.admin]
gid_index = 7
";
    let mut config = Config::new();
    config.load_str(text, "ceph.conf").unwrap();
    assert_eq!(config.get("sl").unwrap(), "1");
    assert_eq!(config.get("port").unwrap(), "2");
    assert_eq!(config.get("gid_index").unwrap(), "3");
}

#[test]
fn quoted_values() {
    let mut config = Config::new();
    config.set("device", "mlx5_0").unwrap();
    config
        .load_str(
            "device = \"\"  # first device\nprovider = \"soft\"\n",
            "q.conf",
        )
        .unwrap();
    assert_eq!(config.get("provider").unwrap(), "soft");
    assert_eq!(config.get("device").unwrap(), "mlx5_0", "set beats file");
    let mut config = Config::new();
    config.load_str("device = \"\"\n", "q.conf").unwrap();
    assert_eq!(config.get("device").unwrap(), "");
    assert_eq!(config.source("device").unwrap(), Source::File);
}

#[test]
fn later_lines_win() {
    let mut config = Config::new();
    config.load_str("sl = 1\nsl = 2\n", "t.conf").unwrap();
    assert_eq!(config.get("sl").unwrap(), "2");
}

#[test]
fn windows_line_endings() {
    let mut config = Config::new();
    config
        .load_str("[global]\r\nsl = 4\r\n# c\r\n", "t.conf")
        .unwrap();
    assert_eq!(config.get("sl").unwrap(), "4");
}

#[test]
fn malformed_lines_name_origin_line_and_text() {
    let cases = [
        (
            "# ok\n\nrnr_retry 2\n",
            "/etc/x.conf:3: expected 'key = value', got 'rnr_retry 2'",
        ),
        ("= 5\n", "/etc/x.conf:1: expected 'key = value', got '= 5'"),
        (
            "sl = 1\n[global\n",
            "/etc/x.conf:2: expected '[section]', got '[global'",
        ),
        ("[]\n", "/etc/x.conf:1: expected '[section]', got '[]'"),
        (
            "device = \"mlx5_0\n",
            "/etc/x.conf:1: unterminated '\"' in the value, got 'device = \"mlx5_0'",
        ),
        (
            "device = \"a\" b\n",
            "/etc/x.conf:1: expected a comment or nothing after the closing '\"', got 'device = \"a\" b'",
        ),
        // Malformed lines are rejected even in skipped sections.
        (
            "[osd.0]\nnonsense\n",
            "/etc/x.conf:2: expected 'key = value', got 'nonsense'",
        ),
    ];
    for (text, message) in cases {
        let mut config = Config::new();
        assert_eq!(
            failure(config.load_str(text, "/etc/x.conf")),
            (ErrorKind::Parse, message.to_string()),
            "{text:?}"
        );
    }
}

#[test]
fn bad_values_and_keys_carry_the_position() {
    let mut config = Config::new();
    assert_eq!(
        failure(config.load_str("sl = 1\nrnr_retry = 8\n", "x.conf")),
        (
            ErrorKind::InvalidValue,
            "x.conf:2: rnr_retry: invalid value '8': allowed 0..7 (7 = infinite)".to_string()
        )
    );
    assert_eq!(
        failure(config.load_str("[rdmx]\nrnr_retyr = 2\n", "x.conf")),
        (
            ErrorKind::UnknownKey,
            "x.conf:2: unknown key 'rnr_retyr' (did you mean 'rnr_retry'?)".to_string()
        )
    );
    assert_eq!(
        failure(config.load_str("ms_async_rdma_support_srq = false\n", "x.conf")).0,
        ErrorKind::InvalidValue
    );
}

#[test]
fn all_or_nothing() {
    let mut config = Config::new();
    let text = "sl = 3\nport = 2\nmax_send_wr = 0\n";
    assert_eq!(
        failure(config.load_str(text, "x.conf")).0,
        ErrorKind::InvalidValue
    );
    assert_eq!(config, Config::new());
    let text = "sl = 3\nport = 2\ngarbage here\n";
    assert_eq!(failure(config.load_str(text, "x.conf")).0, ErrorKind::Parse);
    assert_eq!(config.get("sl").unwrap(), "0");
    assert_eq!(config.source("port").unwrap(), Source::Default);
}

#[test]
fn empty_text_changes_nothing() {
    let mut config = Config::new();
    config.load_str("", "empty.conf").unwrap();
    config
        .load_str("\n# nothing\n[osd]\n", "empty.conf")
        .unwrap();
    assert_eq!(config, Config::new());
}

#[test]
fn load_file_reads_a_file() {
    let dir = std::env::temp_dir().join(format!("rdmx-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rdmx.conf");
    std::fs::write(&path, "[rdmx]\nrnr retry = 4\nbad line\n").unwrap();
    let mut config = Config::new();
    assert_eq!(
        failure(config.load_file(&path)),
        (
            ErrorKind::Parse,
            format!(
                "{}:3: expected 'key = value', got 'bad line'",
                path.display()
            )
        )
    );
    std::fs::write(&path, "[rdmx]\nrnr retry = 4\n").unwrap();
    config.load_file(&path).unwrap();
    assert_eq!(config.get("rnr_retry").unwrap(), "4");
    assert!(
        config
            .dump()
            .contains(&format!("rnr_retry = 4  # file {}:2\n", path.display()))
    );
    let missing = dir.join("missing.conf");
    let (kind, message) = failure(config.load_file(&missing));
    assert_eq!(kind, ErrorKind::Io);
    assert!(
        message.starts_with(&format!("{}: ", missing.display())),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
