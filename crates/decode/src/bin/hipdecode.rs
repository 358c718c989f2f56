//! The `hipdecode` command line.

fn main() {
    println!("hipdecode: no subcommands yet");
}
