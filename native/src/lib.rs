//! cqrs-spark's native pieces: parts of the processor's per-command path that cost several
//! microseconds each in Python, with no user object of their own to run.
//!
//! Each is optional: the Python module that uses one (named in its file) falls back to its own
//! code when this module is not installed, and the tests check both give the same bytes.
//!
//! * `plan`: what the codec's writer and reader are made of, built by the Python module from a
//!   class and its schema (this crate never sees a schema).
//! * `writer`: the codec's Avro writer (`cqrs.codec.binary.record_writer`).
//! * `reader`: the codec's Avro reader (`record_reader`, `values_reader`), driven by the same
//!   plan: the generated Python reader's objects, and an exception wherever that one raises.
//! * `build`: instances of frozen attrs classes without their `__init__` (`cqrs.native.builder`).
//! * `ids`: event ids (`cqrs.domain.decision.event_id_for`).
//! * `clock`: a UTC time's text in an event's header (`cqrs.envelope.event_to_kafka`).
//! * `packed`: the processor's commonest step in one call, on a state kept packed
//!   (`cqrs.processor.step.AggregateStep.apply_packed`).
//! * `memory`: one plain acceptance appended to the dedup memory
//!   (`cqrs.results.AggregateRecord.remember_accepted`).

use pyo3::prelude::*;

mod build;
mod clock;
mod ids;
mod memory;
mod packed;
mod plan;
mod reader;
mod writer;

#[pymodule]
fn cqrs_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // the functions and plans this build takes: cqrs/native.py uses a build of the form it knows
    m.add("FORM", 3)?;
    m.add_class::<writer::Writer>()?;
    m.add_class::<reader::Reader>()?;
    m.add_class::<build::Builder>()?;
    m.add_class::<packed::PackedStep>()?;
    m.add_function(wrap_pyfunction!(ids::event_id, m)?)?;
    m.add_function(wrap_pyfunction!(clock::utc_text, m)?)?;
    m.add_function(wrap_pyfunction!(memory::remember_accepted, m)?)?;
    Ok(())
}
