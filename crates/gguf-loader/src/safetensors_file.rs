//! Hugging Face safetensors checkpoints (f32, f16, bf16) over memmap2, parsed and validated by
//! the `safetensors` crate, with the architecture read from the `config.json` beside them.
//!
//! A checkpoint is a single `*.safetensors` file or a directory of shards; either way the
//! `config.json` in the same directory names the architecture.

use crate::quant::{dequantize, GgmlType};
use crate::{Architecture, GgufError};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One tensor of a safetensors checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeTensorInfo {
    pub name: String,
    /// F32, F16 or BF16.
    pub dtype: GgmlType,
    /// Outermost dimension first, as safetensors and PyTorch order it.
    pub shape: Vec<usize>,
    shard: usize,
    /// Byte range inside the shard's file.
    start: usize,
    end: usize,
}

struct Shard {
    path: PathBuf,
    /// Declared before `map` so it leaves the SIGBUS table before the mapping goes.
    _guard: crate::mapping_guard::Guard,
    map: Mmap,
}

/// A memory-mapped safetensors checkpoint.
pub struct SafetensorsModel {
    pub architecture: Architecture,
    /// The parsed `config.json` (hyperparameters stay in Hugging Face's naming).
    pub config: serde_json::Value,
    shards: Vec<Shard>,
    tensors: Vec<SafeTensorInfo>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for SafetensorsModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsModel")
            .field("architecture", &self.architecture)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

fn st_error(path: &Path, message: impl Into<String>) -> GgufError {
    GgufError::Safetensors {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// The architecture named by a Hugging Face `config.json`.
pub fn architecture_from_config(
    config: &serde_json::Value,
    path: &Path,
) -> Result<Architecture, GgufError> {
    if let Some(model_type) = config.get("model_type").and_then(|v| v.as_str()) {
        let arch = match model_type {
            "llama" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            "qwen3_moe" => Some(Architecture::Qwen3Moe),
            "gemma3" | "gemma3_text" => Some(Architecture::Gemma3),
            _ => None,
        };
        return arch.ok_or_else(|| GgufError::UnsupportedArchitecture {
            name: format!("{model_type} (model_type in {})", path.display()),
            supported: Architecture::names(),
        });
    }
    let first = config
        .get("architectures")
        .and_then(|v| v.get(0))
        .and_then(|v| v.as_str())
        .ok_or_else(|| {
            st_error(
                path,
                "config.json has neither \"model_type\" nor \"architectures\"",
            )
        })?;
    Ok(match first {
        "LlamaForCausalLM" => Architecture::Llama,
        "Qwen2ForCausalLM" => Architecture::Qwen2,
        "Qwen3ForCausalLM" => Architecture::Qwen3,
        "Qwen3MoeForCausalLM" => Architecture::Qwen3Moe,
        "Gemma3ForCausalLM" | "Gemma3ForConditionalGeneration" => Architecture::Gemma3,
        other => {
            return Err(GgufError::UnsupportedArchitecture {
                name: format!("{other} (architectures in {})", path.display()),
                supported: Architecture::names(),
            })
        }
    })
}

impl SafetensorsModel {
    /// Opens a `.safetensors` file or a directory of them, with `config.json` alongside.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsModel, GgufError> {
        let path = path.as_ref();
        let (dir, files) = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| GgufError::io("list", path, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(st_error(path, "the directory holds no *.safetensors file"));
            }
            (path.to_owned(), files)
        } else {
            let dir = path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_owned);
            (dir, vec![path.to_owned()])
        };

        let config_path = dir.join("config.json");
        let config_text = std::fs::read_to_string(&config_path)
            .map_err(|e| GgufError::io("read", &config_path, e))?;
        let config: serde_json::Value = serde_json::from_str(&config_text)
            .map_err(|e| st_error(&config_path, format!("config.json is not valid JSON: {e}")))?;
        let architecture = architecture_from_config(&config, &config_path)?;

        let mut model = SafetensorsModel {
            architecture,
            config,
            shards: Vec::new(),
            tensors: Vec::new(),
            by_name: HashMap::new(),
        };
        for file in files {
            model.add_shard(file)?;
        }
        Ok(model)
    }

    fn add_shard(&mut self, path: PathBuf) -> Result<(), GgufError> {
        let file = std::fs::File::open(&path).map_err(|e| GgufError::io("open", &path, e))?;
        let len = file
            .metadata()
            .map_err(|e| GgufError::io("stat", &path, e))?
            .len();
        if len < 8 {
            return Err(st_error(
                &path,
                format!("{len} bytes is too short for a safetensors header (truncated?)"),
            ));
        }
        // SAFETY: read-only private mapping; as for GGUF files, the checkpoint must not be
        // modified while it is open (documented on `open`'s module).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| GgufError::io("memory-map", &path, e))?;
        // The crate validates the header, every offset and that the data fills the file.
        let parsed = SafeTensors::deserialize(&map).map_err(|e| st_error(&path, e.to_string()))?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| st_error(&path, e.to_string()))?;
        let data_start = 8 + header_len;
        let shard = self.shards.len();
        let mut names: Vec<(String, &safetensors::tensor::TensorInfo)> =
            metadata.tensors().into_iter().collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, info) in names {
            let dtype = match info.dtype {
                Dtype::F32 => GgmlType::F32,
                Dtype::F16 => GgmlType::F16,
                Dtype::BF16 => GgmlType::Bf16,
                other => {
                    return Err(st_error(
                        &path,
                        format!(
                            "tensor {name:?} has dtype {other:?}; supported are F32, F16 and BF16"
                        ),
                    ))
                }
            };
            let (start, end) = info.data_offsets;
            let (start, end) = (data_start + start, data_start + end);
            debug_assert_eq!(
                parsed.tensor(&name).map(|v| v.data().len()).ok(),
                Some(end - start)
            );
            if self
                .by_name
                .insert(name.clone(), self.tensors.len())
                .is_some()
            {
                return Err(GgufError::DuplicateTensor { name });
            }
            self.tensors.push(SafeTensorInfo {
                name,
                dtype,
                shape: info.shape.clone(),
                shard,
                start,
                end,
            });
        }
        drop(parsed);
        let _guard = crate::mapping_guard::register(&map, &path);
        self.shards.push(Shard { path, _guard, map });
        Ok(())
    }

    pub fn tensors(&self) -> &[SafeTensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&SafeTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The files the checkpoint was read from.
    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// The tensor's bytes, borrowed from the mapping.
    pub fn tensor_data(&self, t: &SafeTensorInfo) -> Result<&[u8], GgufError> {
        self.shards
            .get(t.shard)
            .and_then(|s| s.map.get(t.start..t.end))
            .ok_or_else(|| GgufError::MissingTensor {
                name: t.name.clone(),
            })
    }

    /// The tensor converted to f32 (exactly: every f16 and bf16 value is an f32 value).
    pub fn dequantize_tensor(&self, t: &SafeTensorInfo) -> Result<Vec<f32>, GgufError> {
        let data = self.tensor_data(t)?;
        let n = data.len() / t.dtype.type_size();
        let mut out = vec![0f32; n];
        dequantize(t.dtype, data, &mut out)?;
        Ok(out)
    }
}
