//! See the crate description; under construction.
