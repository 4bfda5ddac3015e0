//! Environment variables: `RDMX_<KEY>` (upper-case key, e.g. RDMX_RNR_RETRY, also
//! `RDMX_MS_ASYNC_RDMA_<NAME>` for Ceph names).

use crate::error::{Error, ErrorKind, Result};

/// Every configuration variable starts with this.
pub const ENV_PREFIX: &str = "RDMX_";

/// `RDMX_` variables that are not configuration keys (read by other layers), so they are
/// neither applied nor rejected as unknown keys. `RDMX_TEST_REQUIRE`: the test suites'
/// (tests/require/mod.rs), set for every program a test run starts.
pub const NON_CONFIG_ENV_VARS: &[&str] = &["RDMX_LOG", "RDMX_TEST_REQUIRE"];

/// The variable for `key`: "rnr_retry" -> "RDMX_RNR_RETRY".
pub fn var_name(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.to_ascii_uppercase())
}

/// The `RDMX_` variables worth looking at, from the process environment. A non-UTF-8 value
/// of an `RDMX_` variable is an error (it cannot be a valid value); other variables are
/// not ours and are skipped whatever they hold.
pub(crate) fn process_vars() -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (name, value) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if !name.starts_with(ENV_PREFIX) {
            continue;
        }
        let value = value.into_string().map_err(|_| {
            Error::new(
                ErrorKind::InvalidValue,
                format!("{name}: the value is not valid UTF-8"),
            )
        })?;
        out.push((name, value));
    }
    Ok(out)
}
