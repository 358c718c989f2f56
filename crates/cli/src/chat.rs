//! `hipdecode chat`: an interactive conversation in the terminal over `decode::chat::Chat`.
//! Lines read from stdin are the user's turns; the answers stream to stdout, and the prompts,
//! notes and each turn's token counts go to stderr, so the conversation can be piped.

use crate::args::{BackendArgs, SamplingArgs};
use crate::output::{out, outln};
use anyhow::{Context, Result};
use decode::backend::Backend;
use decode::chat::{Chat, TurnError};
use decode::chat_template::ChatTemplate;
use decode::context::ContextOptions;
use decode::device::{self, WithBackend};
use decode::generate::StopReason;
use decode::sampler::SamplerConfig;
use decode::tokenizer::Tokenizer;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct ChatArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// A Jinja chat template to use instead of the model's (`tokenizer.chat_template`).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// The system prompt, the conversation's first message.
    #[arg(long)]
    system: Option<String>,
    /// Tokens of one answer at most.
    #[arg(short = 'n', long, default_value_t = 512)]
    max_tokens: usize,
    /// End an answer where this text appears in it (left out of the answer); repeatable.
    #[arg(long = "stop", value_name = "TEXT")]
    stops: Vec<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    backend: BackendArgs,
}

pub fn chat(args: ChatArgs) -> Result<()> {
    let choice = device::choose(args.backend.device)?;
    if let Some(note) = &choice.note {
        eprintln!("note: {note}");
    }
    let settings = args.backend.settings()?;
    let sampler = args.sampling.config()?;
    let file = decode::open_model(&args.model)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let name = args.model.display().to_string();
    // Before the weights load: a model without a template is told at once.
    let template =
        ChatTemplate::for_model(&file, &tokenizer, &name, args.chat_template.as_deref())?;
    // Ctrl-C stops the answer being written, not the program.
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&interrupted);
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;
    choice.backend.run(
        settings,
        Conversation {
            args: &args,
            file: &file,
            tokenizer: &tokenizer,
            template,
            sampler,
            interrupted,
        },
    )?
}

struct Conversation<'a> {
    args: &'a ChatArgs,
    file: &'a Arc<decode::gguf_loader::GgufFile>,
    tokenizer: &'a Tokenizer,
    template: ChatTemplate,
    sampler: SamplerConfig,
    interrupted: Arc<AtomicBool>,
}

impl WithBackend for Conversation<'_> {
    type Output = Result<()>;

    fn run<B: Backend>(self, backend: B) -> Result<()> {
        let Conversation {
            args,
            file,
            tokenizer,
            template,
            sampler,
            interrupted,
        } = self;
        let options = ContextOptions {
            context: args.backend.ctx,
            ..Default::default()
        };
        let (session, load_time) = crate::load_progress::load(file, backend, options)?;
        eprintln!(
            "chat with {} on {} (loaded in {}) through {}, context {}: /reset starts over, \
             /exit or Ctrl-D ends, Ctrl-C stops an answer",
            session.spec().arch_name,
            session.backend().describe(),
            crate::load_progress::seconds(load_time),
            template.name(),
            session.options().context
        );
        if let Some(note) = args.sampling.seed_note(&sampler) {
            eprintln!("{note}");
        }
        let mut chat = Chat::new(session, tokenizer, template, args.system.clone())
            .with_stop_strings(args.stops.clone());
        let mut lines = std::io::stdin().lock().lines();
        loop {
            eprint!("> ");
            std::io::stderr().flush().ok();
            let Some(line) = lines.next() else {
                eprintln!();
                return Ok(());
            };
            let line = line.context("reading the next message")?;
            match line.trim() {
                "" => continue,
                "/exit" => return Ok(()),
                "/reset" => {
                    chat.reset();
                    eprintln!("(a new conversation)");
                    continue;
                }
                _ => {}
            }
            interrupted.store(false, Ordering::SeqCst);
            let stop_now = || interrupted.load(Ordering::SeqCst);
            // The first failed write ends the turn's output; it is reported after the turn.
            let mut write_error = None;
            let turn = chat.turn(&line, args.max_tokens, sampler, &stop_now, &mut |text| {
                if write_error.is_none() {
                    write_error = out!("{text}").err();
                }
            });
            if let Some(e) = write_error {
                return Err(e);
            }
            outln!()?;
            match turn {
                Ok(t) => {
                    let why = match t.stop {
                        _ if interrupted.load(Ordering::SeqCst) => "interrupted",
                        _ if t.stop_string => "stop string",
                        StopReason::EndOfSequence => "end of turn",
                        StopReason::TokenLimit => "token limit",
                        StopReason::ContextFull => "context full",
                    };
                    eprintln!(
                        "[{} prompt tokens: {} from the cache, {} computed; {} answer tokens, {why}]",
                        t.prompt_tokens, t.reused, t.prefilled, t.answer_tokens
                    );
                }
                // The conversation is as it was; the next message may do.
                Err(e @ (TurnError::TooLong { .. } | TurnError::Template(_))) => eprintln!("{e}"),
                Err(e) => return Err(e.into()),
            }
        }
    }
}
