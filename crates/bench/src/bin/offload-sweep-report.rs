//! `offload-sweep-report POINTS.tsv OUT_DIR`: the offload sweep's Markdown table and SVG chart
//! (tok/s against GPU MiB, beside llama.cpp's curve) from the runs listed in POINTS.tsv, as
//! `scripts/h200/offload-sweep.sh` writes it. The logic is in `bench::offload_sweep`.

use anyhow::{bail, Context, Result};
use bench::{curve, offload_sweep};
use std::path::PathBuf;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [points, out] = &args[..] else {
        bail!("usage: offload-sweep-report POINTS.tsv OUT_DIR");
    };
    let points = offload_sweep::read_points(&PathBuf::from(points))?;
    if points.is_empty() {
        bail!("no runs listed; the sweep wrote nothing to report");
    }
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let md = offload_sweep::markdown(&points);
    let svg = curve::render(&offload_sweep::series(&points), &offload_sweep::labels());
    for (name, body) in [("offload-sweep.md", &md), ("offload-sweep.svg", &svg)] {
        let path = out.join(name);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    print!("{md}");
    Ok(())
}
