//! Event ids (used by cqrs/domain/decision.py, event_id_for): one per event written.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString};
use sha1::{Digest, Sha1};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `str(uuid.uuid5(UUID(bytes=namespace), f"{aggregate_type}/{aggregate_id}/{version}"))`,
/// with Python's own error when the name cannot be encoded (a lone surrogate).
#[pyfunction]
pub fn event_id(
    namespace: &[u8],
    aggregate_type: &Bound<'_, PyString>,
    aggregate_id: &Bound<'_, PyString>,
    version: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let version_text: String = match version
        .downcast_exact::<PyInt>()
        .ok()
        .and_then(|v| v.extract::<i64>().ok())
    {
        Some(v) => v.to_string(),
        None => version.str()?.to_str()?.to_owned(), // a huge int, or another type: as the f-string
    };
    let (Ok(t), Ok(i)) = (aggregate_type.to_str(), aggregate_id.to_str()) else {
        return Err(encode_error(aggregate_type, aggregate_id, &version_text));
    };
    let mut hasher = Sha1::new();
    hasher.update(namespace);
    hasher.update(t.as_bytes());
    hasher.update(b"/");
    hasher.update(i.as_bytes());
    hasher.update(b"/");
    hasher.update(version_text.as_bytes());
    let digest = hasher.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0F) | 0x50; // version 5
    b[8] = (b[8] & 0x3F) | 0x80; // RFC 4122 variant
    let mut out = String::with_capacity(36);
    for (n, byte) in b.iter().enumerate() {
        if n == 4 || n == 6 || n == 8 || n == 10 {
            out.push('-');
        }
        out.push(HEX[(byte >> 4) as usize] as char);
        out.push(HEX[(byte & 0x0F) as usize] as char);
    }
    Ok(out)
}

/// The error of Python's `f"{aggregate_type}/{aggregate_id}/{version}".encode()` (its position
/// counts in the whole name), for a name with a lone surrogate.
fn encode_error(
    aggregate_type: &Bound<'_, PyString>,
    aggregate_id: &Bound<'_, PyString>,
    version: &str,
) -> PyErr {
    let encoded = (|| -> PyResult<Bound<'_, PyAny>> {
        let name = aggregate_type
            .as_any()
            .add("/")?
            .add(aggregate_id)?
            .add("/")?
            .add(version)?;
        name.call_method0("encode")
    })();
    match encoded {
        Err(err) => err,
        Ok(_) => PyRuntimeError::new_err("an aggregate type or id that is not UTF-8 text encoded"),
    }
}
