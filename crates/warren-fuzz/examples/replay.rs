//! Runs one fuzz target on input files outside libFuzzer, with an ordinary panic message and
//! backtrace; for the `connection` target it first prints the decoded session (the
//! operations a regression test can spell out).
//!
//! `cargo run -p warren-fuzz --example replay -- <target> <file>...`

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(target), files) = (args.next(), args.collect::<Vec<_>>()) else {
        eprintln!("usage: replay <target> <file>...");
        std::process::exit(2);
    };
    let Some((_, run)) = warren_fuzz::TARGETS.iter().find(|(n, _)| *n == target) else {
        eprintln!("unknown target {target}");
        std::process::exit(2);
    };
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        if target == "connection" {
            eprintln!("{f}: {:#?}", warren_fuzz::session::Session::decode(&data));
        }
        run(&data);
        eprintln!("{f}: ok");
    }
}
