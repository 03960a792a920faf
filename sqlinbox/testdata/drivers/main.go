// Command drivers prints the database/sql drivers registered in a program
// that imports only sqlinbox.
package main

import (
	"database/sql"
	"fmt"

	_ "github.com/watermill-inbox/inbox/sqlinbox"
)

func main() {
	for _, d := range sql.Drivers() {
		fmt.Println(d)
	}
}
