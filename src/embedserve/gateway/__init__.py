"""`embedserve gateway`: token-count routing to length pools, online/batch classes, schema guard."""
