package auth_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/syncgate/syncgate/auth"
)

// The gateway verifies hello.token, keeps the identity on the session and
// checks every subscribe, publish and presence frame against its grants.
func ExampleVerifier_Verify() {
	secret := []byte("an HS256 secret of at least 32 bytes!")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	v, err := auth.New(auth.Config{Secret: secret, Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}

	// What a token issuer does.
	token, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: "u1", ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))},
		Topics:           auth.TopicClaims{Subscribe: []string{"room:*"}, Publish: []string{"room:42"}},
	}).SignedString(secret)

	id, err := v.Verify(token)
	if err != nil {
		panic(err)
	}
	fmt.Println(id.ActorID, id.Expires.Sub(now))
	fmt.Println(id.Grants.Allow(auth.Subscribe, "room:7"), id.Grants.Allow(auth.Publish, "room:7"))

	now = now.Add(2 * time.Hour)
	_, err = v.Verify(token)
	fmt.Println(errors.Is(err, auth.ErrExpired))
	// Output:
	// u1 1h0m0s
	// true false
	// true
}
