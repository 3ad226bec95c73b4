// Command benchbackend is the HTTP backend of test/lb/bench.sh: it answers every request
// with its name (a few bytes, like the seed's 229-byte nginx page).
package main

import (
	"flag"
	"log"
	"net/http"
)

func main() {
	addr := flag.String("listen", ":8080", "address")
	name := flag.String("name", "backend", "the body of every answer")
	flag.Parse()
	body := []byte(*name + "\n")
	log.Fatal(http.ListenAndServe(*addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write(body)
	})))
}
