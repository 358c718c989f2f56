//! `cargo run -p gguf-loader --example inspect -- MODEL.gguf [--json]`: the library side of
//! `hipdecode inspect`, runnable on its own.

use gguf_loader::{inspect, GgufFile};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        return Err("usage: inspect MODEL.gguf [--json]".into());
    };
    let f = GgufFile::open(path)?;
    if args.iter().any(|a| a == "--json") {
        println!(
            "{}",
            serde_json::to_string_pretty(&inspect::json_report(&f))?
        );
    } else {
        inspect::write_text_report(&f, &mut std::io::stdout().lock())?;
    }
    Ok(())
}
