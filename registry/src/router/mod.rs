//! The router: picks the tools a message needs. (Being written.)
