//! Active/active rules on literal inputs.
