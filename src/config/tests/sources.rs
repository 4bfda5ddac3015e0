//! Source precedence: defaults < profile < file < env < set, whatever the call order.

use crate::config::{Config, Source};

#[derive(Debug, Clone, Copy)]
enum Step {
    File,
    Env,
    Set,
}

fn apply(config: &mut Config, step: Step) {
    match step {
        Step::File => config.load_str("rnr_retry = 1\n", "t.conf").unwrap(),
        Step::Env => config.load_env_vars([("RDMX_RNR_RETRY", "3")]).unwrap(),
        Step::Set => config.set("rnr_retry", "5").unwrap(),
    }
}

/// Every order of the given steps.
fn orders(steps: &[Step]) -> Vec<Vec<Step>> {
    if steps.len() <= 1 {
        return vec![steps.to_vec()];
    }
    let mut out = Vec::new();
    for (i, first) in steps.iter().enumerate() {
        let mut rest = steps.to_vec();
        rest.remove(i);
        for mut tail in orders(&rest) {
            tail.insert(0, *first);
            out.push(tail);
        }
    }
    out
}

fn check(steps: &[Step], value: &str, source: Source) {
    let all = orders(steps);
    assert_eq!(all.len(), (1..=steps.len()).product::<usize>());
    for order in all {
        let mut config = Config::new();
        for step in &order {
            apply(&mut config, *step);
        }
        assert_eq!(config.get("rnr_retry").unwrap(), value, "{order:?}");
        assert_eq!(config.source("rnr_retry").unwrap(), source, "{order:?}");
    }
}

#[test]
fn file_env_and_set_in_every_order() {
    check(&[Step::File, Step::Env, Step::Set], "5", Source::Explicit);
}

#[test]
fn file_and_env_in_both_orders() {
    check(&[Step::File, Step::Env], "3", Source::Env);
}

#[test]
fn file_and_set_in_both_orders() {
    check(&[Step::File, Step::Set], "5", Source::Explicit);
}

#[test]
fn env_and_set_in_both_orders() {
    check(&[Step::Env, Step::Set], "5", Source::Explicit);
}

#[test]
fn single_sources() {
    check(&[Step::File], "1", Source::File);
    check(&[Step::Env], "3", Source::Env);
    check(&[Step::Set], "5", Source::Explicit);
    check(&[], "2", Source::Default);
}

#[test]
fn set_from_writes_the_named_layer() {
    let mut config = Config::new();
    config.set_from("sl", "3", Source::Explicit).unwrap();
    config.set_from("sl", "2", Source::Env).unwrap();
    config.set_from("sl", "1", Source::File).unwrap();
    assert_eq!(config.get("sl").unwrap(), "3");
    assert_eq!(config.source("sl").unwrap(), Source::Explicit);
    let mut config = Config::new();
    config.set_from("sl", "1", Source::File).unwrap();
    config.set_from("sl", "2", Source::Env).unwrap();
    assert_eq!(config.get("sl").unwrap(), "2");
    assert_eq!(config.source("sl").unwrap(), Source::Env);
}

#[test]
fn a_later_value_of_the_same_source_replaces_the_earlier() {
    let mut config = Config::new();
    config.set("sl", "1").unwrap();
    config.set("sl", "2").unwrap();
    assert_eq!(config.get("sl").unwrap(), "2");
    config.load_str("port = 2\n", "a.conf").unwrap();
    config.load_str("port = 3\n", "b.conf").unwrap();
    assert_eq!(config.get("port").unwrap(), "3");
}

#[test]
fn source_names() {
    let names: Vec<&str> = [
        Source::Default,
        Source::Profile,
        Source::File,
        Source::Env,
        Source::Explicit,
    ]
    .iter()
    .map(|s| s.as_str())
    .collect();
    assert_eq!(names, ["default", "profile", "file", "env", "set"]);
    assert!(Source::Default < Source::Profile);
    assert!(Source::Profile < Source::File);
    assert!(Source::File < Source::Env);
    assert!(Source::Env < Source::Explicit);
}
