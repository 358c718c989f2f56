//! `docs/formats.md` against the code's own lists. The table of tensor types: every type
//! gguf-loader knows has a row, its geometry and CPU dequantization are gguf-loader's, and its
//! "weight products" column says what the kernels' format lists say. The architecture list:
//! gguf-loader's. A type or architecture added to the code without the doc, or the reverse,
//! fails here.

use gguf_loader::GgmlType;
use rocm_kernels::ops::matvec::WEIGHT_FORMATS;
use rocm_kernels::ops::matvec_q8::Q8_FORMATS;
use std::path::PathBuf;

/// One row of the table: the cells, trimmed.
fn tensor_type_rows(doc: &str) -> Vec<Vec<String>> {
    let table = doc
        .split("### Tensor types")
        .nth(1)
        .expect("docs/formats.md has a \"Tensor types\" section");
    table
        .lines()
        .skip_while(|l| !l.starts_with("| type |"))
        .skip(2) // the header and its rule
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn the_tensor_type_table_matches_the_loader_and_the_kernels() {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/formats.md"),
    )
    .expect("docs/formats.md");
    let rows = tensor_type_rows(&doc);
    let mut seen = Vec::new();
    for row in &rows {
        let [name, id, elems, bytes, dequant, products] = row.as_slice() else {
            panic!("a row of six cells, got {row:?}");
        };
        let id: u32 = id.parse().unwrap_or_else(|_| panic!("{name}: id {id:?}"));
        let ty = GgmlType::from_id(id).unwrap_or_else(|_| panic!("{name}: id {id} is unknown"));
        assert_eq!(ty.name(), name, "id {id}");
        assert_eq!(elems, &ty.block_size().to_string(), "{name} elements/block");
        assert_eq!(bytes, &ty.type_size().to_string(), "{name} bytes/block");
        assert_eq!(
            dequant.starts_with("yes"),
            ty.can_dequantize(),
            "{name}: CPU dequantization says {dequant:?}"
        );
        let want = match (WEIGHT_FORMATS.contains(&ty), Q8_FORMATS.contains(&ty)) {
            (true, true) => "every path, 8-bit activations too",
            (true, false) => "every path",
            (false, false) => "no",
            (false, true) => panic!("{name} has an 8-bit product but no plain one"),
        };
        assert_eq!(products, want, "{name}: weight products");
        seen.push(ty);
    }
    for ty in GgmlType::ALL {
        assert!(seen.contains(&ty), "{ty} has no row");
    }
    assert_eq!(seen.len(), GgmlType::ALL.len(), "a type listed twice");
}

#[test]
fn the_architecture_list_is_the_loaders() {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/formats.md"),
    )
    .expect("docs/formats.md");
    let listed = doc
        .split("<!-- architectures:begin -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- architectures:end -->").next())
        .expect("docs/formats.md has the architecture list between its markers");
    assert_eq!(listed, gguf_loader::model::Architecture::names());
}
