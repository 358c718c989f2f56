//! One sequence over a model split for tensor parallelism on the CPU: a [`Session`] of each
//! rank's part ([`Model::load_shard`](crate::model::Model::load_shard)) on a thread of its
//! own, the ranks joined by the in-process collective, every call run on every rank at once.
//!
//! Each rank's session owns its backend, so a rank's weights, KV cache and books are its own
//! ([`SplitSession::memory`] gives them per rank). After the all-reduces every rank holds the
//! same residual stream and the same (whole) output projection, so every rank samples the same
//! token; a rank that disagrees is an error, not a silent pick. A rank whose call fails stops
//! the group ([`collective::Collective::abort`]), so the others return that error at their next
//! collective instead of waiting.

use crate::backend::cpu::CpuBackend;
use crate::context::ContextOptions;
use crate::error::{DecodeError, Result};
use crate::generate::Generator;
use crate::memory::MemoryReport;
use crate::model::{ModelSpec, Shard};
use crate::sampler::SamplerConfig;
use crate::session::Session;
use collective::in_process;
use gguf_loader::GgufFile;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A call run on one rank's session.
type Job = Box<dyn FnOnce(&mut Session<CpuBackend>) + Send>;

/// One rank: the sender of its calls and its thread.
struct Rank {
    jobs: Sender<Job>,
    thread: Option<JoinHandle<()>>,
}

/// A sequence over `ranks` CPU ranks, each holding its part of the model.
pub struct SplitSession {
    ranks: Vec<Rank>,
    spec: ModelSpec,
    context: usize,
    position: usize,
}

impl SplitSession {
    /// Loads `file` split over `ranks` ranks, each on a backend from `backend` (made on the
    /// rank's thread) with a context of one sequence for `options`. An error of any rank (a
    /// split the model's shape refuses, a context that does not fit) is returned, the first
    /// rank's first.
    pub fn load(
        file: &Arc<GgufFile>,
        ranks: usize,
        options: ContextOptions,
        backend: impl Fn() -> CpuBackend + Send + Sync + 'static,
    ) -> Result<SplitSession> {
        let backend = Arc::new(backend);
        let whole = ModelSpec::from_gguf(file)?;
        // Refused here, by name, before any thread starts; rank 0's spec is the session's.
        let spec = crate::model::tensor_parallel::shard_spec(&whole, Shard::new(0, ranks)?)?;
        let (loaded_tx, loaded) = channel::<(usize, Result<()>)>();
        let mut started = Vec::with_capacity(ranks);
        for (rank, comm) in in_process::group(ranks).into_iter().enumerate() {
            let (jobs, inbox) = channel::<Job>();
            let (file, loaded_tx) = (Arc::clone(file), loaded_tx.clone());
            let backend = Arc::clone(&backend);
            let thread = std::thread::Builder::new()
                .name(format!("hipdecode-rank-{rank}"))
                .spawn(move || {
                    let backend = backend().with_collective(Box::new(comm));
                    let shard = Shard { rank, ranks };
                    let session =
                        Session::load_shard(&file, backend, options, shard, &mut |_, _| {});
                    // The sender goes with the word, so the loader's count ends with the ranks.
                    let mut session = match session {
                        Ok(s) => {
                            let _ = loaded_tx.send((rank, Ok(())));
                            drop(loaded_tx);
                            s
                        }
                        Err(e) => {
                            let _ = loaded_tx.send((rank, Err(e)));
                            return;
                        }
                    };
                    for job in inbox {
                        job(&mut session);
                    }
                })
                .map_err(|e| DecodeError::InvalidArgument(format!("starting rank {rank}: {e}")))?;
            started.push(Rank {
                jobs,
                thread: Some(thread),
            });
        }
        drop(loaded_tx);
        let mut results: Vec<(usize, Result<()>)> = loaded.iter().take(ranks).collect();
        results.sort_by_key(|(rank, _)| *rank);
        let session = SplitSession {
            ranks: started,
            spec,
            context: options.context,
            position: 0,
        };
        if results.len() != ranks {
            return Err(DecodeError::InvalidArgument(format!(
                "{} of {ranks} ranks loaded; a rank's thread ended without a word",
                results.len()
            )));
        }
        if let Some((_, Err(e))) = results.into_iter().find(|(_, r)| r.is_err()) {
            return Err(e);
        }
        Ok(session)
    }

    /// Rank 0's part of the model (every rank's is the same shape).
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Each rank's books, rank 0 first.
    pub fn memory(&self) -> Result<Vec<MemoryReport>> {
        self.on_all(|s| Ok(s.memory()))
    }

    /// Runs `call` on every rank's session at once; returns their answers in rank order, or
    /// the first rank's error. A rank whose call fails stops the group first.
    fn on_all<R: Send + 'static>(
        &self,
        call: impl Fn(&mut Session<CpuBackend>) -> Result<R> + Send + Sync + 'static,
    ) -> Result<Vec<R>> {
        let call = Arc::new(call);
        let mut answers = Vec::with_capacity(self.ranks.len());
        for (i, rank) in self.ranks.iter().enumerate() {
            let (tx, rx) = channel();
            let call = Arc::clone(&call);
            let job: Job = Box::new(move |s: &mut Session<CpuBackend>| {
                let answer = call(s);
                if let Err(e) = &answer {
                    s.backend_mut().abort_collective(&e.to_string());
                }
                let _ = tx.send(answer);
            });
            rank.jobs
                .send(job)
                .map_err(|_| DecodeError::InvalidArgument(format!("rank {i} has stopped")))?;
            answers.push(rx);
        }
        answers
            .into_iter()
            .enumerate()
            .map(|(i, rx)| {
                rx.recv().unwrap_or_else(|_| {
                    Err(DecodeError::InvalidArgument(format!(
                        "rank {i} ended during the call"
                    )))
                })
            })
            .collect()
    }

    /// The token every rank drew; an error where they differ.
    fn agreed(tokens: Vec<u32>) -> Result<u32> {
        match tokens.split_first() {
            Some((&first, rest)) if rest.iter().all(|&t| t == first) => Ok(first),
            _ => Err(DecodeError::InvalidArgument(format!(
                "the ranks drew different tokens {tokens:?}; their logits should be the same"
            ))),
        }
    }
}

impl Generator for SplitSession {
    fn restart_sampler(&mut self) {
        // Cannot fail on a rank; a stopped rank shows at the next call.
        let _ = self.on_all(|s| {
            s.restart_sampler();
            Ok(())
        });
    }

    fn forward(&mut self, tokens: &[u32]) -> Result<()> {
        let (tokens, n) = (tokens.to_vec(), tokens.len());
        self.on_all(move |s| s.forward(&tokens))?;
        self.position += n;
        Ok(())
    }

    fn prefill_and_sample(&mut self, prompt: &[u32], sampler: &SamplerConfig) -> Result<u32> {
        let (prompt, sampler) = (prompt.to_vec(), *sampler);
        let n = prompt.len();
        let token = Self::agreed(self.on_all(move |s| s.prefill_and_sample(&prompt, &sampler))?)?;
        self.position += n;
        Ok(token)
    }

    fn decode_and_sample(&mut self, token: u32, sampler: &SamplerConfig) -> Result<u32> {
        let sampler = *sampler;
        let next = Self::agreed(self.on_all(move |s| s.decode_and_sample(token, &sampler))?)?;
        self.position += 1;
        Ok(next)
    }

    fn position(&self) -> usize {
        self.position
    }

    fn context_len(&self) -> usize {
        self.context
    }
}

impl Drop for SplitSession {
    /// Closes every rank's inbox, then waits for its thread (its session drops there).
    fn drop(&mut self) {
        let threads: Vec<_> = self
            .ranks
            .iter_mut()
            .filter_map(|r| r.thread.take())
            .collect();
        self.ranks.clear();
        for t in threads {
            let _ = t.join();
        }
    }
}
