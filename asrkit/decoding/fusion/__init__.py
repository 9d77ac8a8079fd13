"""What a search adds to its own scores: word boosting and n-gram LM fusion as token
automata (`tables`), read from a spec the commands fill (`spec`) and stepped inside the
searches (`steps`)."""
