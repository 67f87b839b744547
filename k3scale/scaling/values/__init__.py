"""What a reported number is: input checks, verdicts, intervals and estimates, fit results, and
the fit artifact's schema (k3scale/scaling/values/fitdoc.py). Imports nothing else of scaling."""
