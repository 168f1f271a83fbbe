"""After the search: selection and confirmation, the front and stable/, the report,
tracking, the audit and warm start."""
