//! The bundled examples, compiled in so that `slipstream up` works from any
//! directory and on a machine with nothing but the binary.

pub const QUICKSTART: &str = include_str!("../../../examples/quickstart/quickstart.yaml");
pub const QUICKSTART_NAME: &str = "examples/quickstart/quickstart.yaml (bundled)";
