//! A UTC time as an event header's text (used by cqrs/envelope.py, event_to_kafka).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDateAccess, PyDateTime, PyTimeAccess};

/// `t.isoformat(timespec="microseconds").encode()` for a datetime in UTC (the caller checks
/// that its tzinfo is `datetime.timezone.utc`): `YYYY-MM-DDTHH:MM:SS.ffffff+00:00`.
#[pyfunction]
pub fn utc_text<'py>(t: &Bound<'py, PyDateTime>) -> Bound<'py, PyBytes> {
    let text = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        t.get_year(),
        t.get_month(),
        t.get_day(),
        t.get_hour(),
        t.get_minute(),
        t.get_second(),
        t.get_microsecond()
    );
    PyBytes::new(t.py(), text.as_bytes())
}
