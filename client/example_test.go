package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

// ExampleDial follows a topic and publishes to it. It needs a running
// server, so it has no Output line.
func ExampleDial() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "ws://localhost:8080/v1/ws", &client.Options{BuildID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The handler runs on the read loop: keep it short.
	sub, err := c.Subscribe(ctx, "chat", nil, func(p *frames.Patch) {
		for _, op := range p.Patches {
			fmt.Printf("%s %s\n", op.Op, op.Row)
		}
	})
	if err != nil {
		log.Fatal(err)
	}

	lsn, err := c.Publish(ctx, "chat", json.RawMessage(`{"text":"hello"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published at", lsn)

	if err := sub.Drop(ctx); err != nil {
		log.Fatal(err)
	}
}
