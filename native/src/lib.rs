//! cqrs-spark's native pieces: parts of the processor's per-command path that cost several
//! microseconds each in Python, with no user object of their own to run.
//!
//! Each is optional: the Python module that uses one (named in its file) falls back to its own
//! code when this module is not installed, and the tests check both give the same bytes.
//!
//! * `writer`: the codec's Avro writer (`cqrs.codec.binary.record_writer`), driven by a plan
//!   the Python module builds from a class and its schema; this crate never sees a schema.
//! * `reader`: the codec's Avro reader (`record_reader`, `values_reader`), driven by the same
//!   plan: the generated Python reader's objects, and an exception wherever that one raises.

use pyo3::prelude::*;

mod reader;
mod writer;

#[pymodule]
fn cqrs_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // the form of the plans this build reads: cqrs.codec.binary uses a build whose form it knows
    m.add("PLAN_FORM", 1)?;
    m.add_class::<writer::Writer>()?;
    m.add_class::<reader::Reader>()?;
    Ok(())
}
