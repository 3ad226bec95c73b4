// Command hostaccel is the node agent and CLI; all logic lives in internal/.
package main

import (
	"os"

	"github.com/hostaccel/hostaccel/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
