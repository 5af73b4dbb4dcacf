//! The processor's commonest step in one call (used by cqrs/processor/step.py,
//! `AggregateStep.apply_packed`): one plain command on an aggregate whose state the worker
//! keeps packed (`StoredAggregate.packed()`: a header, then the AggregateRecord's Avro bytes).
//! At a million aggregates most commands are this: the state row is unpacked, its record and
//! snapshot decoded, the command decided, the new record made, encoded and packed again, each
//! a few Python objects that live for one command. Here only the command, the aggregate and the
//! decision are Python objects: the record is read and written as bytes, and Python runs
//! `decide` (the app's handler) and what the codec and the envelope make of its events.
//!
//! Whatever this path does not take it leaves to the Python step, before anything is decided
//! (`None`: a row of another format, a process manager's stream remembered, a command seen
//! before, a derived or garbled id, a payload or snapshot its readers do not read, ...) or
//! after (the decision, handed over: a rejection, a failure, deadlines, a record over the limit,
//! a dedup memory to trim). The Python step writes the same records either way:
//! tests/property/test_step_one_properties.py holds the two to the same records and rows.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

use crate::memory::{
    appended_bounds, compact_entry, millis, scan_bounds, utc_micros, COMPACT_SIZE,
};
use crate::reader::Cursor;
use crate::writer::zigzag;

const PACKED_FORMAT: u8 = 1;
/// `state_table._PACKED`, ">BqBiqq": format, version, deleted, source partition, applied offset,
/// commands.
const PACKED_HEADER: usize = 1 + 8 + 1 + 4 + 8 + 8;

/// A packed row's header.
struct Head {
    partition: i32,
    offset: i64,
    commands: i64,
}

fn be_i64(d: &[u8]) -> i64 {
    i64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

impl Head {
    fn parse(d: &[u8]) -> Option<Head> {
        if d.len() < PACKED_HEADER || d[0] != PACKED_FORMAT {
            return None;
        }
        Some(Head {
            partition: i32::from_be_bytes(d[10..14].try_into().expect("4 bytes")),
            offset: be_i64(&d[14..]),
            commands: be_i64(&d[22..]),
        })
    }
}

/// An AggregateRecord's fields, as the bytes its Avro body holds them.
struct StateRecord<'a> {
    version: i64,
    deleted: bool,
    snapshot: Option<&'a [u8]>,
    seen_ids: &'a str,
    seen_times: &'a [u8],
    seen_sizes: &'a [u8],
    seen_results: &'a [u8],
    plain: bool, // no process manager's stream, no derived id retrying
}

impl<'a> StateRecord<'a> {
    /// The record whose single-object encoding is `d` (its header `header`), as the codec's
    /// reader reads it; None for anything that reader would not read the same way.
    fn parse(d: &'a [u8], header: &[u8]) -> Option<StateRecord<'a>> {
        if !d.starts_with(header) {
            return None;
        }
        let mut c = Cursor { d, p: header.len() };
        let version = c.long()?;
        let deleted = match c.byte()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let snapshot = match c.long()? {
            0 => None,
            1 => Some(c.span()?),
            _ => return None,
        };
        let seen_ids = std::str::from_utf8(c.span()?).ok()?;
        let seen_times = c.span()?;
        let seen_sizes = c.span()?;
        let seen_results = c.span()?;
        let streams = c.span()?;
        let marks = c.span()?;
        let retrying = c.span()?;
        if c.p != d.len() || seen_times.len() % 8 != 0 {
            return None;
        }
        Some(StateRecord {
            version,
            deleted,
            snapshot,
            seen_ids,
            seen_times,
            seen_sizes,
            seen_results,
            plain: streams.is_empty() && marks.is_empty() && retrying.is_empty(),
        })
    }
}

fn put_bytes(buf: &mut Vec<u8>, parts: &[&[u8]]) {
    zigzag(buf, parts.iter().map(|p| p.len()).sum::<usize>() as i64);
    for p in parts {
        buf.extend_from_slice(p);
    }
}

/// `PackedStep(parts)`: `step(aggregate_type, aggregate_id, packed, record, watch)` is the
/// StepResult of `record` (an InputRecord read on the hot path: envelope and payload given)
/// decided on the state `packed` holds, with the new row packed in it (`row`); a tuple
/// `(entry, aggregate, command, inputs, decision)` for the Python step to go on from; or None.
/// `parts`: a dict of what the step is made of (see `AggregateStep._native_packed_step`).
#[pyclass(frozen, module = "cqrs_native")]
pub struct PackedStep {
    record_header: Vec<u8>,
    reads: Py<PyDict>,
    writes: Py<PyDict>,
    encode: PyObject,
    entry_of: PyObject,
    decide: PyObject,
    route: PyObject,
    make_input: PyObject,
    accepted: Py<PyType>,
    write_result: PyObject,
    make_output: PyObject,
    make_row: PyObject,
    make_result: PyObject,
    event_to_kafka: PyObject,
    monotonic: PyObject,
    utc: PyObject,
    events_topic: Py<PyString>,
    results_topic: Py<PyString>,
    accepted_status: Py<PyString>,
    results_partitions: Option<i64>,
    max_record: i64,
    event_frame: i64,
    record_frame: i64,
    max_state_key: i64,
    window_ms: i64,
    max_count: i64,
    derived_prefix: String,
}

fn part<'py, T: FromPyObject<'py>>(parts: &Bound<'py, PyDict>, name: &str) -> PyResult<T> {
    match parts.get_item(name)? {
        Some(v) => v.extract(),
        None => Err(pyo3::exceptions::PyKeyError::new_err(name.to_owned())),
    }
}

#[pymethods]
impl PackedStep {
    #[new]
    fn new(parts: &Bound<'_, PyDict>) -> PyResult<Self> {
        Ok(PackedStep {
            record_header: part::<Vec<u8>>(parts, "record_header")?,
            reads: part(parts, "reads")?,
            writes: part(parts, "writes")?,
            encode: part(parts, "encode")?,
            entry_of: part(parts, "entry_of")?,
            decide: part(parts, "decide")?,
            route: part(parts, "route")?,
            make_input: part(parts, "make_input")?,
            accepted: part(parts, "accepted")?,
            write_result: part(parts, "write_result")?,
            make_output: part(parts, "make_output")?,
            make_row: part(parts, "make_row")?,
            make_result: part(parts, "make_result")?,
            event_to_kafka: part(parts, "event_to_kafka")?,
            monotonic: part(parts, "monotonic")?,
            utc: part(parts, "utc")?,
            events_topic: part(parts, "events_topic")?,
            results_topic: part(parts, "results_topic")?,
            accepted_status: part(parts, "accepted_status")?,
            results_partitions: part(parts, "results_partitions")?,
            max_record: part(parts, "max_record_bytes")?,
            event_frame: part(parts, "event_frame_bytes")?,
            record_frame: part(parts, "record_frame_bytes")?,
            max_state_key: part(parts, "max_state_key_bytes")?,
            window_ms: part(parts, "window_ms")?,
            max_count: part(parts, "max_count")?,
            derived_prefix: part(parts, "derived_prefix")?,
        })
    }

    fn __call__<'py>(
        &self,
        py: Python<'py>,
        aggregate_type: &Bound<'py, PyString>,
        aggregate_id: &Bound<'py, PyString>,
        packed: &Bound<'py, PyBytes>,
        record: &Bound<'py, PyAny>,
        watch: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let data = packed.as_bytes();
        let Some(head) = Head::parse(data) else {
            return Ok(None);
        };
        let Some(state) = StateRecord::parse(&data[PACKED_HEADER..], &self.record_header) else {
            return Ok(None);
        };
        if !state.plain {
            return Ok(None);
        }
        // the state row's key, as apply() checks it (Cassandra's limit)
        let id_chars = aggregate_id.len()? as i64;
        if 4 * id_chars + aggregate_type.len()? as i64 > self.max_state_key {
            return Ok(None);
        }
        let Ok(entry) = self.entry_of.bind(py).call1((aggregate_type,)) else {
            return Ok(None); // an unknown type: the Python step answers it
        };
        let env = record.getattr(pyo3::intern!(py, "envelope"))?;
        let payload = record.getattr(pyo3::intern!(py, "payload"))?;
        let headers = record.getattr(pyo3::intern!(py, "headers"))?;
        let key = record.getattr(pyo3::intern!(py, "key"))?;
        let value = record.getattr(pyo3::intern!(py, "value"))?;
        let (Ok(payload), Ok(key), Ok(value)) = (
            payload.downcast_exact::<PyBytes>(),
            key.downcast_exact::<PyBytes>(),
            value.downcast_exact::<PyBytes>(),
        ) else {
            return Ok(None);
        };
        if env.is_none() || headers.is_truthy()? {
            return Ok(None); // the older form, with the envelope in headers
        }
        let partition: i32 = record.getattr(pyo3::intern!(py, "partition"))?.extract()?;
        let offset: i64 = record.getattr(pyo3::intern!(py, "offset"))?.extract()?;
        if partition == head.partition && offset <= head.offset {
            return Ok(None); // applied already (the caller drops those)
        }
        let mut cid = env.getattr(pyo3::intern!(py, "command_id"))?;
        if !cid.is_truthy()? {
            cid = env.getattr(pyo3::intern!(py, "message_id"))?;
        }
        let Ok(cid) = cid.downcast_exact::<PyString>() else {
            return Ok(None);
        };
        let Ok(cid_text) = cid.to_str() else {
            return Ok(None);
        };
        if cid_text.contains('\0')
            || cid_text.starts_with(&self.derived_prefix)
            || state.seen_ids.contains(cid_text)
        {
            return Ok(None); // a duplicate, a derived id: the general path
        }
        let Some(command) = self.read(py, payload)? else {
            return Ok(None);
        };
        let decoded = match state.snapshot {
            None => py.None().into_bound(py),
            Some(snap) => match self.read(py, &PyBytes::new(py, snap))? {
                Some(obj) => obj,
                None => return Ok(None),
            },
        };
        let timestamp = env.getattr(pyo3::intern!(py, "timestamp"))?;
        let input = self.make_input.bind(py).call1((
            cid,
            &command,
            env.getattr(pyo3::intern!(py, "expected_version"))?,
            &timestamp,
            env.getattr(pyo3::intern!(py, "correlation_id"))?,
        ))?;
        let inputs = PyList::new(py, [input])?;
        let watched = !watch.is_none();
        if watched {
            watch.setattr(pyo3::intern!(py, "record"), record)?;
            watch.setattr(pyo3::intern!(py, "since"), self.monotonic.bind(py).call0()?)?;
        }
        let decision = self.decide.bind(py).call1((
            &entry,
            aggregate_id,
            &decoded,
            state.version,
            &inputs,
            self.route.bind(py),
        ))?;
        if watched {
            watch.setattr(pyo3::intern!(py, "record"), py.None())?;
        }
        let hand_over = |py: Python<'py>| -> PyResult<Option<Bound<'py, PyAny>>> {
            let parts: [&Bound<'py, PyAny>; 5] = [&entry, &decoded, &command, &inputs, &decision];
            Ok(Some(PyTuple::new(py, parts)?.into_any()))
        };
        let outcome = decision
            .getattr(pyo3::intern!(py, "outcomes"))?
            .get_item(0)?;
        if !outcome.get_type().is(self.accepted.bind(py))
            || outcome.getattr(pyo3::intern!(py, "deadlines"))?.is_truthy()?
        {
            return hand_over(py);
        }
        let events = outcome.getattr(pyo3::intern!(py, "events"))?;
        let n_events = events.len()?;
        let out = PyList::empty(py);
        let event_ids = PyList::empty(py);
        if n_events > 0 {
            // as in _one: only an event over the limit by this bound is counted exactly
            let room = self.max_record
                - self.event_frame
                - (key.as_bytes().len() + value.as_bytes().len()) as i64;
            for e in events.try_iter()? {
                let e = e?;
                let body = self.encode_obj(py, &e.getattr(pyo3::intern!(py, "event"))?)?;
                let made = self.event_to_kafka.bind(py).call1((&e, body))?;
                let made = made.downcast::<PyTuple>()?;
                let (k, v, h) = (made.get_item(0)?, made.get_item(1)?, made.get_item(2)?);
                let type_chars = e.getattr(pyo3::intern!(py, "type_name"))?.len()? as i64;
                if v.len()? as i64 + type_chars > room {
                    return hand_over(py); // record_size decides: the Python step
                }
                out.append(self.make_output.bind(py).call1((
                    self.events_topic.bind(py),
                    k,
                    v,
                    h,
                    py.None(),
                    py.None(),
                ))?)?;
                event_ids.append(e.getattr(pyo3::intern!(py, "event_id"))?)?;
            }
        }
        let answered = outcome.getattr(pyo3::intern!(py, "version"))?;
        let accepted = self.accepted_status.bind(py);
        let fields: [Bound<'py, PyAny>; 13] = [
            cid.clone().into_any(),
            accepted.clone().into_any(),
            aggregate_type.clone().into_any(),
            aggregate_id.clone().into_any(),
            answered.clone(),
            timestamp.clone(),
            partition.into_pyobject(py)?.into_any(),
            offset.into_pyobject(py)?.into_any(),
            event_ids.into_any(),
            py.None().into_bound(py),
            py.None().into_bound(py),
            py.None().into_bound(py),
            py.None().into_bound(py),
        ];
        let Ok(result) = self.write_result.bind(py).call1((PyTuple::new(py, fields)?,)) else {
            return hand_over(py); // a value it does not take: the general path says why
        };
        let Ok(result) = result.downcast_into_exact::<PyBytes>() else {
            return hand_over(py);
        };
        let result_len = result.as_bytes().len() as i64;
        if result_len == 0 || result_len + 4 * cid.len()? as i64 > self.max_record - self.record_frame {
            return hand_over(py);
        }
        // the dedup memory: one plain acceptance appended, when nothing falls out of it
        let Some(micros) = utc_micros(&timestamp, self.utc.bind(py)) else {
            return hand_over(py);
        };
        let ms = millis(micros);
        let times = state.seen_times;
        let old = (!times.is_empty()).then(|| scan_bounds(times));
        if appended_bounds(old, times.len() / 8, ms, self.window_ms, self.max_count).is_none() {
            return hand_over(py); // something falls out of the memory: the Python step trims it
        }
        let (Ok(answered), Ok(n_events32)) = (answered.extract::<i64>(), u32::try_from(n_events))
        else {
            return hand_over(py);
        };
        let entry_bytes = compact_entry(answered, n_events32, partition, offset, micros);
        let reply = self.reply_partition(py, &env)?;
        out.append(self.make_output.bind(py).call1((
            self.results_topic.bind(py),
            PyBytes::new(py, cid_text.as_bytes()),
            &result,
            PyList::empty(py),
            reply,
            accepted,
        ))?)?;
        // the new state: version, snapshot, the memory appended
        let version: i64 = decision.getattr(pyo3::intern!(py, "version"))?.extract()?;
        let mut kept = decoded.clone();
        let mut deleted = state.deleted;
        let new_snapshot;
        let snapshot: Option<&[u8]> = if version != state.version {
            kept = decision.getattr(pyo3::intern!(py, "state"))?;
            deleted = kept.is_none() && version > 0;
            if kept.is_none() {
                None
            } else {
                new_snapshot = self.encode_obj(py, &kept)?;
                Some(new_snapshot.as_bytes())
            }
        } else {
            state.snapshot
        };
        let mut body = Vec::with_capacity(
            self.record_header.len()
                + 40
                + snapshot.map_or(0, |s| s.len())
                + state.seen_ids.len()
                + cid_text.len()
                + times.len()
                + state.seen_sizes.len()
                + state.seen_results.len()
                + COMPACT_SIZE,
        );
        body.extend_from_slice(&self.record_header);
        zigzag(&mut body, version);
        body.push(deleted as u8);
        match snapshot {
            None => body.push(0),
            Some(s) => {
                body.push(2);
                put_bytes(&mut body, &[s]);
            }
        }
        if state.seen_ids.is_empty() {
            put_bytes(&mut body, &[cid_text.as_bytes()]);
        } else {
            put_bytes(&mut body, &[state.seen_ids.as_bytes(), b"\0", cid_text.as_bytes()]);
        }
        put_bytes(&mut body, &[times, &ms.to_le_bytes()]);
        put_bytes(&mut body, &[state.seen_sizes, &(COMPACT_SIZE as u32).to_le_bytes()]);
        put_bytes(&mut body, &[state.seen_results, &entry_bytes]);
        body.extend_from_slice(&[0, 0, 0]); // no stream, no mark, none retrying
        let commands = head.commands + 1;
        let row_bytes = PyBytes::new_with(py, PACKED_HEADER + body.len(), |buf| {
            buf[0] = PACKED_FORMAT;
            buf[1..9].copy_from_slice(&version.to_be_bytes());
            buf[9] = deleted as u8;
            buf[10..14].copy_from_slice(&partition.to_be_bytes());
            buf[14..22].copy_from_slice(&offset.to_be_bytes());
            buf[22..30].copy_from_slice(&commands.to_be_bytes());
            buf[PACKED_HEADER..].copy_from_slice(&body);
            Ok(())
        })?;
        let row = self.make_row.bind(py).call1((
            aggregate_id,
            aggregate_type,
            version,
            PyBool::new(py, deleted),
            PyBytes::new(py, &body),
            partition,
            offset,
            commands,
        ))?;
        let name = pyo3::intern!(py, "_packed");
        let rc = unsafe {
            pyo3::ffi::PyObject_GenericSetAttr(row.as_ptr(), name.as_ptr(), row_bytes.as_ptr())
        };
        if rc < 0 {
            return Err(PyErr::fetch(py));
        }
        let made = self.make_result.bind(py).call1((
            py.None(),
            kept,
            out,
            PyList::empty(py),
            row,
        ))?;
        Ok(Some(made))
    }
}

impl PackedStep {
    /// The codec's read of single-object bytes, as `Codec.decode` takes its quick path; None
    /// where that would go on to fastavro.
    fn read<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyBytes>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let d = data.as_bytes();
        if d.len() < self.record_header.len() {
            return Ok(None);
        }
        let head = PyBytes::new(py, &d[..self.record_header.len()]);
        let Some(read) = self.reads.bind(py).get_item(head)? else {
            return Ok(None);
        };
        Ok(read.call1((data, self.record_header.len())).ok())
    }

    /// `Codec.encode(obj)`: its writer for the class when it has one and it takes the value,
    /// else `encode` itself (which raises the error naming the field).
    fn encode_obj<'py>(
        &self,
        py: Python<'py>,
        obj: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if let Some(write) = self.writes.bind(py).get_item(obj.get_type())? {
            if let Ok(made) = write.call1((obj,)) {
                if let Ok(b) = made.downcast_into_exact::<PyBytes>() {
                    return Ok(b);
                }
            }
        }
        Ok(self.encode.bind(py).call1((obj,))?.downcast_into::<PyBytes>()?)
    }

    /// `AggregateStep._reply_partition`.
    fn reply_partition<'py>(
        &self,
        py: Python<'py>,
        env: &Bound<'py, PyAny>,
    ) -> PyResult<Option<i64>> {
        let wanted = env.getattr(pyo3::intern!(py, "reply_partition"))?;
        let (Some(limit), false) = (self.results_partitions, wanted.is_none()) else {
            return Ok(None);
        };
        let wanted: i64 = wanted.extract()?;
        Ok((0 <= wanted && wanted < limit).then_some(wanted))
    }
}
