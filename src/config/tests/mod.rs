//! Tests of the config module through its public API. Expected values are written out here
//! (not read from the tables under test) so a wrong table entry fails a test.

mod aliases;
mod dump;
mod encoding;
mod env;
mod file;
mod keys;
mod profiles;
mod sources;
mod validate;

use crate::error::{ErrorKind, Result};

/// The error of a result that must have failed, as (kind, message).
fn failure<T: std::fmt::Debug>(result: Result<T>) -> (ErrorKind, String) {
    match result {
        Ok(value) => panic!("expected an error, got Ok({value:?})"),
        Err(e) => (e.kind(), e.message().to_string()),
    }
}
