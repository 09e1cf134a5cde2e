"""The gateway's POST routes: the pipeline every route runs on and each route's job."""
