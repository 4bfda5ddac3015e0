//! The `RDMX_*` variables of the environment, split into rdmx's and the user's own.
//!
//! `rdmx-ibv exec` runs other people's programs, whose environment may hold variables of
//! their own that happen to start with `RDMX_` (`RDMX_HOME`, a build directory). Those
//! are *foreign* ([`rdmx::config::is_foreign_env_var`]: no configuration key, no Ceph name,
//! and not within typo distance of one): the launcher and the provider leave them alone
//! (CMD still sees them) and the launcher says so on stderr. A variable that is a key, or
//! close enough to one to get a "did you mean" (`RDMX_RNR_RETYR`), is rdmx's: a bad value
//! or a misspelling stops `exec` before CMD runs, since ignoring it would run CMD with a
//! configuration the user did not ask for.

use std::ffi::OsString;

/// `(name, value)` pairs of rdmx's variables.
pub type Vars = Vec<(String, String)>;

/// The environment's `RDMX_*` variables: (rdmx's, with UTF-8 values; names of foreign
/// ones). A non-UTF-8 value of one of rdmx's is an error (it cannot be valid); other
/// variables are not looked at.
pub fn split(
    env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<(Vars, Vec<String>), String> {
    let mut ours = Vec::new();
    let mut foreign = Vec::new();
    for (name, value) in env {
        let name = name.to_string_lossy().into_owned();
        if !name.starts_with(rdmx::config::env::ENV_PREFIX) {
            continue;
        }
        if rdmx::config::is_foreign_env_var(&name) {
            foreign.push(name);
            continue;
        }
        let value = value
            .into_string()
            .map_err(|_| format!("{name}: the value is not valid UTF-8"))?;
        ours.push((name, value));
    }
    Ok((ours, foreign))
}

/// The rdmx configuration of this process's environment, foreign `RDMX_` variables left
/// out (the provider inside CMD reads it so: the launcher accepted them).
pub fn config_from_env() -> Result<rdmx::config::Config, String> {
    let (ours, foreign) = split(std::env::vars_os())?;
    if !foreign.is_empty() {
        log::info!(target: "rdmx::ibv", "not rdmx configuration (left alone): {}", foreign.join(", "));
    }
    rdmx::config::Config::from_env_vars(ours).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    #[test]
    fn splits_rdmx_variables_from_the_users_own() {
        let (ours, foreign) = split(env(&[
            ("HOME", "/root"),
            ("RDMX_RNR_RETRY", "3"),
            ("RDMX_HOME", "/opt/x"),
            ("RDMX_RNR_RETYR", "3"),
            ("RDMX_LOG", "debug"),
        ]))
        .unwrap();
        assert_eq!(
            ours,
            vec![
                ("RDMX_RNR_RETRY".to_string(), "3".to_string()),
                ("RDMX_RNR_RETYR".to_string(), "3".to_string()),
                ("RDMX_LOG".to_string(), "debug".to_string()),
            ]
        );
        assert_eq!(foreign, vec!["RDMX_HOME".to_string()]);
    }

    #[test]
    fn a_non_utf8_value_of_ours_is_an_error_of_a_foreign_one_is_not() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, 0xfe]);
        let e = split(vec![("RDMX_RNR_RETRY".into(), bad.clone())]).unwrap_err();
        assert!(e.contains("RDMX_RNR_RETRY"), "{e}");
        let (ours, foreign) = split(vec![("RDMX_HOME".into(), bad)]).unwrap();
        assert!(ours.is_empty());
        assert_eq!(foreign, vec!["RDMX_HOME".to_string()]);
    }
}
