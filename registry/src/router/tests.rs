//! Router tests on a small in-memory catalog.
