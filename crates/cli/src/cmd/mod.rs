pub mod agent;
pub mod apply;
pub mod down;
pub mod exec;
pub mod logs;
pub mod node;
pub mod status;
pub mod up;
