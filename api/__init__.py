"""The REST service: a thin FastAPI layer over advisor/ and collectors/."""
