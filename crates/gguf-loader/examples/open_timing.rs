//! Opens a GGUF file repeatedly and prints the mean wall time per open+index, for profiling
//! the reader outside criterion: `--example open_timing -- MODEL.gguf [N]`.

use gguf_loader::GgufFile;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or("usage: open_timing MODEL.gguf [N]")?;
    let n: u32 = args.get(1).map_or(Ok(100), |s| s.parse())?;
    let mut tensors = 0;
    let start = Instant::now();
    for _ in 0..n {
        let f = GgufFile::open(path)?;
        tensors += f
            .tensors()
            .iter()
            .filter(|t| !f.tensor_data(t).is_empty())
            .count();
    }
    let per = start.elapsed() / n;
    println!(
        "{n} opens, {} tensors each, {per:?} per open+index",
        tensors / n as usize
    );
    Ok(())
}
