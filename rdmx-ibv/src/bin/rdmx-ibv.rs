//! `rdmx-ibv exec --ip ADDR [--set KEY=VALUE]... [--profile NAME] -- CMD [ARGS...]`:
//! runs an unmodified libibverbs program with the device `rdmx0` (see
//! `rdmx_ibv::launcher` and `rdmx-ibv exec --help`).

use rdmx_ibv::launcher::{self, Parsed};

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match launcher::parse_args(&args) {
        Ok(Parsed::Help) => print!("{}", launcher::USAGE),
        Ok(Parsed::Exec(a)) => {
            let e = launcher::exec(&a);
            eprintln!("rdmx-ibv: {e}");
            std::process::exit(127);
        }
        Err(e) => {
            eprintln!("rdmx-ibv: {e}\n\n{}", launcher::USAGE);
            std::process::exit(2);
        }
    }
}
