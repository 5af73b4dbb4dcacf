//! The dedup memory's commonest step (used by cqrs/results.py,
//! `AggregateRecord.remember_accepted`): one plain acceptance appended to an aggregate's
//! record, which nothing falls out of. In Python that is a compact entry packed from the
//! result's fields, four packed fields concatenated and a record made: ~8 us a command at one
//! command per aggregate, most of it interpreter work on small values.

use pyo3::prelude::*;
use pyo3::types::{
    PyBytes, PyDateAccess, PyDateTime, PyString, PyTimeAccess, PyTuple, PyTzInfoAccess,
};

use crate::writer::days_from_civil;

const COMPACT_MARK: u8 = 0x01;
pub(crate) const COMPACT_SIZE: usize = 1 + 8 + 4 + 4 + 8 + 8; // mark, then "<qIiqq"
const EXACT_F64: i64 = 1 << 53; // micros whose float division equals Python's int division

/// `remember_accepted(record, make_record, utc, command_id, timestamp, answered, events,
/// partition, offset, version, deleted, snapshot, window_ms, max_count)`: what
/// `record.remember(version, deleted, snapshot, [accepted_seen(command_id, timestamp,
/// answered, events, partition, offset)], window_ms, max_count)` returns when the entry is
/// simply appended (the memory is not full and every time stays in the window), its time bounds
/// set as that sets them; None in every other case (a time not in UTC or past year 2255, a value
/// out of the compact entry's range, a NUL or a surrogate in the id, a memory to trim), for the
/// Python path to take, with its errors.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn remember_accepted<'py>(
    py: Python<'py>,
    record: &Bound<'py, PyAny>,
    make_record: &Bound<'py, PyAny>,
    utc: &Bound<'py, PyAny>,
    command_id: &Bound<'py, PyAny>,
    timestamp: &Bound<'py, PyAny>,
    answered: &Bound<'py, PyAny>,
    events: &Bound<'py, PyAny>,
    partition: &Bound<'py, PyAny>,
    offset: &Bound<'py, PyAny>,
    version: &Bound<'py, PyAny>,
    deleted: &Bound<'py, PyAny>,
    snapshot: &Bound<'py, PyAny>,
    window_ms: i64,
    max_count: i64,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(micros) = utc_micros(timestamp, utc) else {
        return Ok(None);
    };
    let ms = millis(micros);
    let (Ok(cid), Ok(answered), Ok(events), Ok(partition), Ok(offset)) = (
        command_id.downcast_exact::<PyString>(),
        answered.extract::<i64>(),
        events.extract::<u32>(),
        partition.extract::<i32>(),
        offset.extract::<i64>(),
    ) else {
        return Ok(None);
    };
    let Ok(cid_text) = cid.to_str() else {
        return Ok(None); // a lone surrogate: Python's error
    };
    if cid_text.contains('\0') {
        return Ok(None);
    }
    let seen_times_obj = record.getattr(pyo3::intern!(py, "seen_times"))?;
    let Ok(seen_times) = seen_times_obj.downcast_exact::<PyBytes>() else {
        return Ok(None);
    };
    let times = seen_times.as_bytes();
    let old = if times.is_empty() { None } else { Some(time_bounds(py, record, times)?) };
    let Some((lo, hi)) = appended_bounds(old, times.len() / 8, ms, window_ms, max_count) else {
        return Ok(None); // something falls out of the memory: the Python path trims it
    };
    let ids_obj = record.getattr(pyo3::intern!(py, "seen_ids"))?;
    let Ok(ids) = ids_obj.downcast_exact::<PyString>() else {
        return Ok(None);
    };
    let Ok(ids_text) = ids.to_str() else {
        return Ok(None); // a lone surrogate remembered: Python joins it
    };
    let new_ids = if ids_text.is_empty() {
        cid.clone()
    } else {
        let mut joined = String::with_capacity(ids_text.len() + 1 + cid_text.len());
        joined.push_str(ids_text);
        joined.push('\0');
        joined.push_str(cid_text);
        PyString::new(py, &joined)
    };
    let sizes_obj = record.getattr(pyo3::intern!(py, "seen_sizes"))?;
    let results_obj = record.getattr(pyo3::intern!(py, "seen_results"))?;
    let (Ok(sizes), Ok(results)) = (
        sizes_obj.downcast_exact::<PyBytes>(),
        results_obj.downcast_exact::<PyBytes>(),
    ) else {
        return Ok(None);
    };
    let new_times = appended(py, times, &ms.to_le_bytes());
    let new_sizes = appended(py, sizes.as_bytes(), &(COMPACT_SIZE as u32).to_le_bytes());
    let entry = compact_entry(answered, events, partition, offset, micros);
    let new_results = appended(py, results.as_bytes(), &entry);
    let made = make_record.call1((
        version,
        deleted,
        snapshot,
        new_ids,
        new_times,
        new_sizes,
        new_results,
        record.getattr(pyo3::intern!(py, "streams"))?,
        record.getattr(pyo3::intern!(py, "stream_marks"))?,
        record.getattr(pyo3::intern!(py, "retrying"))?,
    ))?;
    set_bounds(&made, lo, hi)?;
    Ok(Some(made))
}

/// A plain acceptance's compact entry in the memory (`results._COMPACT`, after its mark).
pub(crate) fn compact_entry(
    answered: i64,
    events: u32,
    partition: i32,
    offset: i64,
    micros: i64,
) -> [u8; COMPACT_SIZE] {
    let mut entry = [0u8; COMPACT_SIZE];
    entry[0] = COMPACT_MARK;
    entry[1..9].copy_from_slice(&answered.to_le_bytes());
    entry[9..13].copy_from_slice(&events.to_le_bytes());
    entry[13..17].copy_from_slice(&partition.to_le_bytes());
    entry[17..25].copy_from_slice(&offset.to_le_bytes());
    entry[25..33].copy_from_slice(&micros.to_le_bytes());
    entry
}

/// Microseconds since the epoch of a datetime in `datetime.timezone.utc`, below 2**53 in size;
/// None for anything else.
pub(crate) fn utc_micros(timestamp: &Bound<'_, PyAny>, utc: &Bound<'_, PyAny>) -> Option<i64> {
    let dt = timestamp.downcast_exact::<PyDateTime>().ok()?;
    if !dt.get_tzinfo()?.is(utc) {
        return None;
    }
    let days = days_from_civil(dt.get_year() as i64, dt.get_month() as i64, dt.get_day() as i64);
    let secs = days * 86_400
        + dt.get_hour() as i64 * 3_600
        + dt.get_minute() as i64 * 60
        + dt.get_second() as i64;
    let micros = secs * 1_000_000 + dt.get_microsecond() as i64;
    (-EXACT_F64 < micros && micros < EXACT_F64).then_some(micros)
}

/// Milliseconds of a time in microseconds as `int(micros / 1_000_000 * 1000)` (exact in
/// floats below 2**53): a remembered command's time.
pub(crate) fn millis(micros: i64) -> i64 {
    (micros as f64 / 1_000_000.0 * 1000.0) as i64
}

/// The oldest and newest of remembered times (`seen_times`, int64 little endian each; not
/// empty).
pub(crate) fn scan_bounds(times: &[u8]) -> (i64, i64) {
    let mut lo = i64::MAX;
    let mut hi = i64::MIN;
    for chunk in times.chunks_exact(8) {
        let t = i64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        lo = lo.min(t);
        hi = hi.max(t);
    }
    (lo, hi)
}

/// The memory's time bounds once a command at `ms` is appended to its `count` remembered
/// ones (bounded by `old`; None: none), when nothing falls out of it (`kept_indices`' rule:
/// at most `max_count`, all within `window_ms` of the newest); None when something would.
pub(crate) fn appended_bounds(
    old: Option<(i64, i64)>,
    count: usize,
    ms: i64,
    window_ms: i64,
    max_count: i64,
) -> Option<(i64, i64)> {
    let (lo, hi) = old.map_or((ms, ms), |(lo, hi)| (lo.min(ms), hi.max(ms)));
    if count as i64 >= max_count || (lo as i128) < hi as i128 - window_ms as i128 {
        None
    } else {
        Some((lo, hi))
    }
}

/// The record's oldest and newest remembered times (its memory is not empty): its cached
/// bounds, else computed and cached on it, as `AggregateRecord.time_bounds` does.
fn time_bounds(py: Python<'_>, record: &Bound<'_, PyAny>, times: &[u8]) -> PyResult<(i64, i64)> {
    let cached = record.getattr(pyo3::intern!(py, "_time_bounds"))?;
    if !cached.is_none() {
        return cached.extract::<(i64, i64)>();
    }
    let (lo, hi) = scan_bounds(times);
    set_bounds(record, lo, hi)?;
    Ok((lo, hi))
}

fn set_bounds(record: &Bound<'_, PyAny>, lo: i64, hi: i64) -> PyResult<()> {
    let py = record.py();
    let bounds = PyTuple::new(py, [lo, hi])?;
    let name = pyo3::intern!(py, "_time_bounds");
    let rc = unsafe {
        pyo3::ffi::PyObject_GenericSetAttr(record.as_ptr(), name.as_ptr(), bounds.as_ptr())
    };
    if rc < 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(())
}

/// `head + tail`, as a new bytes object.
fn appended<'py>(py: Python<'py>, head: &[u8], tail: &[u8]) -> Bound<'py, PyBytes> {
    PyBytes::new_with(py, head.len() + tail.len(), |buf| {
        buf[..head.len()].copy_from_slice(head);
        buf[head.len()..].copy_from_slice(tail);
        Ok(())
    })
    .expect("filling a new bytes object does not fail")
}
