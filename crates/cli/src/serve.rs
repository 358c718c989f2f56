//! `hipdecode serve`: the OpenAI-compatible server (`serve` crate) over this model. The
//! server listens (and answers `/health` with 503) while the model loads on this thread; the
//! engine then runs here, on the thread that owns the backend, until a shutdown stops it.

use crate::args::BackendArgs;
use anyhow::{Context as _, Result};
use decode::backend::Backend;
use decode::chat_template::{ChatTemplate, TemplateError};
use decode::context::{Context, ContextOptions};
use decode::device::{self, BackendSettings, WithBackend};
use decode::memory::human_bytes;
use decode::model::Model;
use decode::tokenizer::Tokenizer;
use serve::{LoadedModel, ServeConfig, Server};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// The address to listen on. The default answers this machine only; 0.0.0.0 opens the
    /// server to the network (set --api-key then).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port (0: one the OS picks; the address is printed either way).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics. Other users of the machine
    /// can read a command line (`ps`); --api-key-file keeps the key out of it.
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the key of --api-key from this file (its first line, surrounding blanks dropped).
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// Sequences generated at once (each of --ctx positions at most).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Rows one step carries at most: a decode row of every running sequence, then prompt
    /// chunks. Default: the GPU's prefill chunk (512), or 64 on the CPU.
    #[arg(long)]
    batch: Option<usize>,
    /// Bytes of KV cache all sequences share ("2GiB", "512MiB"): requests are admitted while
    /// their prompts fit and wait otherwise. Default: HIPDECODE_KV_BUDGET; else on a GPU what
    /// the device has left after the weights, activations and workspace, less a reserve, at
    /// most every sequence's whole context (--parallel × --ctx positions), which the CPU
    /// always takes.
    #[arg(long)]
    kv_budget: Option<String>,
    /// GPU: cap everything the server takes on the device (bytes, "6.5GiB", "75%"), as
    /// `hipdecode run --gpu-budget`.
    #[arg(long)]
    gpu_budget: Option<String>,
    /// The most pinned host memory the offloaded weights may take (bytes or "32GiB").
    #[arg(long)]
    host_budget: Option<String>,
    /// Requests that may wait for a sequence; one more is refused with 503 and Retry-After.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Request bodies above this size are refused with 413 ("1MiB", bytes).
    #[arg(long, default_value = "1MiB")]
    max_body: String,
    /// A request's deadline in seconds from its arrival. Still queued then, it gets 503;
    /// running, it ends with what it has and finish_reason "length".
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// Seconds running requests may go on after SIGINT or SIGTERM before they are cut (with
    /// finish_reason "length").
    #[arg(long, default_value_t = 10.0)]
    shutdown_timeout: f64,
    /// A Jinja chat template to use instead of the model's (`tokenizer.chat_template`).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// The model's id in /v1/models and the responses (default: the file's name).
    #[arg(long)]
    alias: Option<String>,
    #[command(flatten)]
    backend: BackendArgs,
}

fn seconds(flag: &str, s: f64) -> Result<Duration> {
    anyhow::ensure!(
        s.is_finite() && s > 0.0 && s < 1e9,
        "{flag} must be a number of seconds > 0, got {s}"
    );
    Ok(Duration::from_secs_f64(s))
}

pub fn serve(args: ServeArgs) -> Result<()> {
    anyhow::ensure!(args.parallel >= 1, "--parallel must be at least 1");
    let choice = device::choose(args.backend.device)?;
    if let Some(note) = &choice.note {
        eprintln!("note: {note}");
    }
    let base = args.backend.settings()?;
    let max_body = offload::parse_size("--max-body", &args.max_body)?;
    let kv_budget = match args.kv_budget.as_deref() {
        Some(b) => Some((offload::parse_size("--kv-budget", b)?, "--kv-budget")),
        None => (decode::layout::kv_fit::KV_BUDGET.read()?)
            .map(|b| (b, decode::layout::kv_fit::KV_BUDGET.name)),
    };
    let config = ServeConfig {
        host: args.host.clone(),
        port: args.port,
        api_key: api_key(&args)?,
        max_body: usize::try_from(max_body).unwrap_or(usize::MAX),
        max_queue: args.max_queue,
        timeout: seconds("--timeout", args.timeout)?,
        shutdown_timeout: seconds("--shutdown-timeout", args.shutdown_timeout)?,
    };
    let file = decode::open_model(&args.model)?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
    let name = args.model.display().to_string();
    let template =
        match ChatTemplate::for_model(&file, &tokenizer, &name, args.chat_template.as_deref()) {
            Ok(t) => Ok(t),
            // Completions still work without one; chat requests are told why not.
            Err(e @ TemplateError::Missing { .. }) => {
                eprintln!("note: {e}; /v1/chat/completions will refuse requests");
                Err(e.to_string())
            }
            Err(e) => return Err(e.into()),
        };
    let batch = match (args.batch, &choice.backend) {
        (Some(b), _) => b,
        (None, device::BackendChoice::Gpu(_)) => base.gpu_max_batch,
        (None, device::BackendChoice::Cpu) => ContextOptions::default().max_batch,
    };
    anyhow::ensure!(
        batch >= args.parallel,
        "--batch {batch} is smaller than --parallel {}: a step must hold a decode row of \
         every running sequence",
        args.parallel
    );
    let base = BackendSettings {
        gpu_max_batch: base.gpu_max_batch.max(batch),
        ..base
    };
    // A GPU budget is planned for the server's own bounds: its sequences, its steps, and the
    // KV pool of the KV budget where one is given (the planner's share of the budget).
    let plan_bounds = ContextOptions {
        context: args.backend.ctx,
        max_batch: batch,
        all_logits: false,
        sequences: args.parallel,
        kv_blocks: match kv_budget {
            Some((budget, source)) => {
                let spec = decode::model::ModelSpec::from_gguf(&file)?;
                let context = decode::layout::context::clamp_context(&spec, args.backend.ctx);
                // The type the GPU backend will store: -ctk, f16 by default.
                let kv = base.kv_type.unwrap_or(decode::kv::KvType::F16);
                Some(kv_budget_blocks(&spec, context, batch, kv, budget, source)?)
            }
            None => None,
        },
    };
    let settings = crate::args::with_budget(
        base,
        &choice.backend,
        &file,
        &plan_bounds,
        args.gpu_budget.as_deref(),
        args.host_budget.as_deref(),
    )?;
    let server = Server::start(config)?;
    eprintln!("listening on http://{}", server.addr());
    let alias = args.alias.clone().unwrap_or_else(|| {
        (args.model.file_name()).map_or_else(|| name.clone(), |n| n.to_string_lossy().into_owned())
    });
    let gpu_config = match settings.gpu_config {
        Some(c) => c,
        None => decode::backend::gpu::GpuConfig::from_process()?,
    };
    let step_block_batch = settings.gpu_max_batch;
    choice.backend.run(
        settings,
        Serving {
            args: &args,
            file: &file,
            tokenizer,
            template,
            alias,
            kv_budget,
            batch,
            gpu_config,
            step_block_batch,
            server: &server,
        },
    )??;
    server.wait()?;
    eprintln!("stopped");
    Ok(())
}

struct Serving<'a> {
    args: &'a ServeArgs,
    file: &'a Arc<decode::gguf_loader::GgufFile>,
    tokenizer: Arc<Tokenizer>,
    template: Result<ChatTemplate, String>,
    alias: String,
    /// The KV budget in bytes and the flag or variable that gave it.
    kv_budget: Option<(u64, &'static str)>,
    batch: usize,
    /// The GPU backend's settings and step block, which size its buffers.
    gpu_config: decode::backend::gpu::GpuConfig,
    step_block_batch: usize,
    server: &'a Server,
}

impl WithBackend for Serving<'_> {
    type Output = Result<()>;

    fn run<B: Backend>(self, mut backend: B) -> Result<()> {
        let args = self.args;
        let model = Model::load(self.file, &mut backend)?;
        let spec = model.spec();
        let context = decode::layout::context::clamp_context(spec, args.backend.ctx);
        let max_batch = self.batch;
        let block_bytes = decode::layout::context::pool_block_bytes(
            spec,
            context,
            max_batch,
            backend.kv_storage(),
        )?;
        let whole = ContextOptions {
            context,
            max_batch,
            all_logits: false,
            sequences: args.parallel,
            kv_blocks: None,
        };
        let kv_blocks = match self.kv_budget {
            // On a device without a budget: the pool the memory left after the weights holds.
            None => match backend.device_room() {
                Some(room) => {
                    let room = room.context("reading the device's free memory")?;
                    // The GPU's buffers as its settings size them (the vendor GEMM's taken as
                    // present: the larger estimate).
                    let options = decode::layout::LayoutOptions::gpu(
                        &whole,
                        &self.gpu_config,
                        self.step_block_batch,
                    );
                    let fit =
                        decode::layout::kv_fit::kv_blocks_that_fit(self.file, &options, &room)
                            .context("sizing the KV pool to the device")?;
                    eprintln!("{}", fit.describe());
                    fit.blocks
                }
                None => None,
            },
            Some((budget, source)) => Some(kv_budget_blocks(
                spec,
                context,
                max_batch,
                backend.kv_storage(),
                budget,
                source,
            )?),
        };
        let options = ContextOptions { kv_blocks, ..whole };
        let ctx = Context::new(&model, &mut backend, options).context("making the context")?;
        let plan = ctx.kv_plan();
        let positions = plan.pool_blocks * plan.block;
        let kv_budget_bytes = plan.pool_blocks as u64 * block_bytes;
        // A shared pool's memory is taken as its blocks are handed out (where the device maps
        // memory piece by piece): what the KV cache holds now.
        let kv_now = backend.memory().get(decode::memory::MemoryTag::KvCache);
        eprintln!(
            "{} on {}: {} sequences of up to {} positions; KV pool {} blocks of {} positions \
             ({}, {:.1} full sequences; {} held now); chat template: {}",
            spec.arch_name,
            backend.describe(),
            args.parallel,
            ctx.capacity(),
            plan.pool_blocks,
            plan.block,
            human_bytes(kv_budget_bytes),
            positions as f64 / ctx.capacity() as f64,
            human_bytes(kv_now),
            match &self.template {
                Ok(t) => t.name().to_string(),
                Err(_) => "none".into(),
            }
        );
        let (engine, inbox) = decode::engine::channel();
        self.server.ready(LoadedModel {
            name: self.alias,
            tokenizer: self.tokenizer,
            template: self.template,
            engine,
            context: ctx.capacity(),
            sequences: args.parallel,
            kv_budget_bytes,
            kv_bytes_per_token: block_bytes / plan.block as u64,
        });
        // A shutdown that began while the model loaded found no engine to stop.
        if self.server.shutting_down() {
            return Ok(());
        }
        eprintln!("ready");
        decode::engine::run(&model, backend, ctx, inbox)?;
        Ok(())
    }
}

/// Blocks of `kv` KV that `budget` bytes (from `source`) hold, or an error when not one does.
fn kv_budget_blocks(
    spec: &decode::model::ModelSpec,
    context: usize,
    max_batch: usize,
    kv: decode::kv::KvType,
    budget: u64,
    source: &str,
) -> Result<usize> {
    let block_bytes = decode::layout::context::pool_block_bytes(spec, context, max_batch, kv)?;
    let blocks = budget / block_bytes.max(1);
    anyhow::ensure!(
        blocks >= 1,
        "{source} {} holds no KV block: one block of {} positions takes {}; raise the budget",
        human_bytes(budget),
        decode::kv::block_positions(),
        human_bytes(block_bytes)
    );
    Ok(usize::try_from(blocks).unwrap_or(usize::MAX))
}

/// The key from --api-key, or from the first line of --api-key-file: an error names the file
/// when it cannot be read or holds no key.
fn api_key(args: &ServeArgs) -> Result<Option<String>> {
    let Some(path) = &args.api_key_file else {
        return Ok(args.api_key.clone());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--api-key-file {}: cannot read it", path.display()))?;
    let key = text.lines().next().unwrap_or("").trim();
    anyhow::ensure!(
        !key.is_empty(),
        "--api-key-file {}: its first line holds no key",
        path.display()
    );
    Ok(Some(key.to_string()))
}
