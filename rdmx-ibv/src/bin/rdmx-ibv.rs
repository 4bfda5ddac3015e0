//! `rdmx-ibv exec --ip ADDR [--set KEY=VALUE]... [--profile NAME] -- CMD [ARGS...]`.

fn main() {
    eprintln!("rdmx-ibv: not built yet");
    std::process::exit(2);
}
